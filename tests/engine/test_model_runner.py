import torch

from tandem.engine.model_runner import joined_rows


def test_joined_rows_of_one_tensor_split_in_order_share_its_memory():
    logits = torch.randn(7, 11)
    joined = joined_rows(list(logits.split([1, 3, 2, 1])))
    assert joined.data_ptr() == logits.data_ptr() and torch.equal(joined, logits)
    # Not consecutive (a prefill row keeping only its last position leaves a gap, another order,
    # another tensor): copied, as torch.cat does.
    gap = [logits[0:1], logits[3:4], logits[4:6], logits[6:7]]
    for parts in (gap, [logits[4:6], logits[0:4]], [logits[0:2], torch.randn(2, 11)]):
        joined = joined_rows(parts)
        assert torch.equal(joined, torch.cat(parts))
        assert joined.data_ptr() not in {p.data_ptr() for p in parts}


def test_joined_rows_of_a_middle_run_start_at_its_first_row():
    logits = torch.randn(6, 5)
    joined = joined_rows([logits[2:3], logits[3:5]])
    assert torch.equal(joined, logits[2:5]) and joined.data_ptr() == logits[2:3].data_ptr()
