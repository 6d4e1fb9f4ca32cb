"""tandem.measure: black-box measurement of any OpenAI-compatible endpoint over HTTP. Torch-free.

- observation: what one request's answer was and how fast (TTFT, TPOT, end to end, errors), recorded
  from the HTTP response; the validation gate records both sides of a pair with it
- logprobs: an answer's per-token logprobs (`TokenTrack`), as an OpenAI-compatible server returns them
- endpoint: a Profile of a running server (vLLM, SGLang, llama.cpp, a tandem replica):
  `tandem profile --endpoint URL`

Imported module by module (`from tandem.measure.observation import observe`): `tandem --help` stays light.
"""
