"""generation_config.json -> the sampling defaults a request falls back to (vLLM's --generation-config auto)."""

from tandem.model.generation_config import sampling_defaults


def test_do_sample_false_means_greedy_whatever_else_the_file_says():
    assert sampling_defaults({"do_sample": False, "temperature": 0.7, "top_p": 0.9}) == {"temperature": 0.0}


def test_sampling_fields_map_to_request_fields():
    gen = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1,
           "min_p": 0.05, "max_new_tokens": 512, "bos_token_id": 1}  # fmt: skip
    assert sampling_defaults(gen) == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1, "min_p": 0.05, "max_tokens": 512,
    }  # fmt: skip
    assert sampling_defaults({"temperature": 0.8}) == {"temperature": 0.8}  # do_sample absent: as written


def test_unusable_values_are_skipped_not_applied():
    assert sampling_defaults({"top_k": 2.5, "max_new_tokens": 0, "temperature": "hot", "top_p": True}) == {}
    assert sampling_defaults({}) == {}
