"""Uploads: host tensors to the GPU through one page-locked ring. Checked
against the tensors themselves, with the stream held back so the ring comes
round to copies not yet run (each must have read its bytes before they are
overwritten), across a growth of the ring for an upload larger than half."""
import pytest
import torch

from ukv_torch.tiers.uploads import Uploads

pytestmark = pytest.mark.gpu


def test_uploads_arrive_whole_while_the_ring_comes_round_to_queued_copies():
    uploads = Uploads(torch.device("cuda"), size=1 << 12)
    gen = torch.Generator().manual_seed(3)
    sizes = [0, 1, 7, 64, 200, 255, 100, 3, 255] * 4 + [600, 17, 1000, 5]  # 600: more than half of 4 KiB
    sources, outs = [], []
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s: every copy below is queued behind it when the ring comes round
    for n in sizes:
        t = torch.randint(-2**62, 2**62, (n, 1), generator=gen, dtype=torch.int64)
        sources.append(t.clone())
        outs.append(uploads(t))
        t.fill_(0)  # the caller's tensor may change at once: its bytes were taken
    torch.cuda.synchronize()
    for source, out in zip(sources, outs):
        assert out.is_cuda and out.shape == source.shape and torch.equal(out.cpu(), source)
    assert uploads.size >= 2 * 1000 * 8  # grown for the largest


def test_int32_and_two_dimensional_tensors_keep_their_dtype_and_shape():
    uploads = Uploads(torch.device("cuda"))
    t = torch.arange(12, dtype=torch.int32).view(3, 4)
    out = uploads(t)
    assert out.dtype == torch.int32 and out.shape == (3, 4) and torch.equal(out.cpu(), t)
