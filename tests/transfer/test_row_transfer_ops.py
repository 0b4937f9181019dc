"""gather_rows and scatter_rows: row runs of up to four 2-D tensors (any
dtype, strided rows) to and from one byte buffer, against a reference; the
run count read from a tensor; runs outside a tensor or the buffer, or
writing one place twice, refused on the host (skipped on the GPU);
every argument checked by name with nothing written; opcheck and
torch.compile; on a GPU, the same bytes with no allocation, graph replays
reading new runs and counts, and torch.compile with reduce-overhead."""
import random

import pytest
import torch

import ukv_torch
from support.devices import DEVICES
from support.row_runs import random_runs, row_bytes, run_tensors

BACKENDS = ["aot_eager", "inductor"]


def make_tensors(device, rows=40):
    """fp32 and bf16 planes and an indexer-like uint8 view with a row stride (its rows are
    the first 12 bytes of every 20-byte group), as the transfer gathers them."""
    wide = torch.randn(rows, 5, device=device)
    narrow = torch.randn(rows, 3, device=device).to(torch.bfloat16)
    indexer = torch.randint(0, 255, (rows // 2, 20), dtype=torch.uint8, device=device)[:, :12]
    return [wide, narrow, indexer]


def tensor_rows(t, first, rows):
    """The rows' bytes, packed."""
    return t[first: first + rows].contiguous().view(torch.uint8).flatten().cpu()


def reference_gather(tensors, runs, count, nbytes, fill=7):
    """What gather_rows writes into a buffer of `fill` bytes."""
    buffer = torch.full((nbytes,), fill, dtype=torch.uint8)
    for tensor, first, rows, offset in runs[:max(0, min(count, len(runs)))]:
        t = tensors[tensor]
        inside = 0 <= tensor < len(tensors) and rows > 0 and first >= 0 and offset >= 0 and \
            first + rows <= t.shape[0] and offset + rows * row_bytes(t) <= nbytes
        if inside:
            buffer[offset: offset + rows * row_bytes(t)] = tensor_rows(t, first, rows)
    return buffer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_gather_then_scatter_round_trip(device, seed):
    rng = random.Random(seed)
    tensors = make_tensors(device)
    runs, nbytes = random_runs(rng, tensors, 24)
    buffer = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    ukv_torch.gather_rows(tensors, *run_tensors(runs, len(runs), device), buffer)
    assert torch.equal(buffer.cpu(), reference_gather([t.cpu() for t in tensors], runs, len(runs), nbytes))

    targets = [torch.zeros_like(t) if t.is_contiguous() else
               torch.zeros(t.shape[0], 20, dtype=t.dtype, device=device)[:, :12] for t in tensors]
    ukv_torch.scatter_rows(targets, *run_tensors(runs, len(runs), device), buffer)
    for i, (t, target) in enumerate(zip(tensors, targets)):
        written = set(r for tensor, first, rows, _ in runs if tensor == i for r in range(first, first + rows))
        for r in range(t.shape[0]):
            expected = t[r] if r in written else torch.zeros_like(t[r])
            assert torch.equal(target[r], expected), (i, r)
    if not targets[2].is_contiguous():  # the bytes between a strided tensor's rows are not written
        assert int(targets[2].as_strided((targets[2].shape[0], 8), (20, 1), 12).count_nonzero()) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [-3, 0, 1, 5, 999])
def test_run_count_comes_from_the_tensor(device, count):
    tensors = make_tensors(device)
    runs, nbytes = random_runs(random.Random(1), tensors, 10)
    buffer = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    ukv_torch.gather_rows(tensors, *run_tensors(runs, count, device), buffer)
    assert torch.equal(buffer.cpu(), reference_gather([t.cpu() for t in tensors], runs, count, nbytes))


BAD_RUNS = [[3, 0, 1, 0], [-1, 0, 1, 0], [0, -1, 1, 0], [0, 39, 2, 0], [0, 0, 0, 0], [0, 0, -2, 0], [0, 0, 1, -1],
            [0, 0, 1, 100], [0, 0, 2**40, 0], [0, 2**62, 2, 0], [0, 0, 1, 2**62]]


@pytest.mark.gpu
@pytest.mark.parametrize("bad", BAD_RUNS)
def test_runs_outside_a_tensor_or_the_buffer_are_skipped_on_the_device(bad):
    device = "cuda"
    tensors = make_tensors(device)[:3]
    good = [1, 0, 2, 0]  # 12 bytes at 0
    buffer = torch.full((110,), 7, dtype=torch.uint8, device=device)
    ukv_torch.gather_rows(tensors, *run_tensors([good, bad], 2, device), buffer)
    assert torch.equal(buffer.cpu(), reference_gather([t.cpu() for t in tensors], [good], 1, 110))
    targets = [t.clone() for t in tensors]
    ukv_torch.scatter_rows(targets, *run_tensors([bad], 1, device), buffer)
    assert all(torch.equal(a, b) for a, b in zip(targets, tensors))


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
@pytest.mark.parametrize("bad", BAD_RUNS)
def test_runs_outside_a_tensor_or_the_buffer_are_refused_on_the_host(op, bad):
    """Named by index, before anything is copied (the good run before it included)."""
    tensors = make_tensors("cpu")[:3]
    before = [t.clone() for t in tensors]
    buffer = torch.full((110,), 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"{op}: runs\[1\] = \({bad[0]}, {bad[1]}, {bad[2]}, {bad[3]}\)"):
        getattr(ukv_torch, op)(tensors, *run_tensors([[1, 0, 2, 0], bad], 2, "cpu"), buffer)
    assert buffer.tolist() == [7] * 110
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))


@pytest.mark.parametrize("op, runs, what", [
    ("scatter_rows", [[0, 3, 2, 0], [0, 4, 1, 40]], "tensor rows"),     # rows 3-4 and 4 of one tensor
    ("scatter_rows", [[1, 0, 3, 0], [1, 2, 3, 20]], "tensor rows"),
    ("gather_rows", [[0, 0, 1, 0], [0, 5, 1, 19]], "buffer bytes"),     # bytes 0-19 and 19-38
    ("gather_rows", [[2, 0, 2, 30], [1, 0, 1, 40]], "buffer bytes")])
def test_runs_that_write_the_same_place_are_refused_on_the_host(op, runs, what):
    tensors = make_tensors("cpu")
    before = [t.clone() for t in tensors]
    buffer = torch.full((110,), 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"{op}: runs\[\d\] and runs\[\d\] write the same {what}"):
        getattr(ukv_torch, op)(tensors, *run_tensors(runs, 2, "cpu"), buffer)
    assert buffer.tolist() == [7] * 110
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    tensors = make_tensors(device)
    buffer = torch.full((8,), 7, dtype=torch.uint8, device=device)
    ukv_torch.gather_rows(tensors, torch.zeros(0, 4, dtype=torch.int64, device=device),
                          torch.tensor([3], dtype=torch.int32, device=device), buffer)
    ukv_torch.gather_rows([], *run_tensors([[0, 0, 1, 0]], 0, device), buffer)
    ukv_torch.scatter_rows([], *run_tensors([[0, 0, 1, 0]], 0, device), buffer)
    assert buffer.tolist() == [7] * 8


# ---------------------------------------------------------------- bad arguments --
def valid_args(device="cpu"):
    tensors = make_tensors(device)
    runs, count = run_tensors([[0, 0, 1, 0], [2, 1, 1, 20]], 2, device)
    return {"tensors": tensors, "runs": runs, "run_count": count,
            "buffer": torch.zeros(32, dtype=torch.uint8, device=device)}


def bad_arguments():
    """(argument, label, how to break it, exception, message fragment; {list} is sources or targets)."""
    contiguous_rows = "tensor whose rows are contiguous and do not overlap"
    return [
        ("buffer", "dtype", lambda b: b.to(torch.int32), TypeError, "buffer must be uint8"),
        ("buffer", "rank", lambda b: b.view(4, 8), ValueError, "buffer must be a contiguous 1-D"),
        ("buffer", "stride", lambda b: b[::2], ValueError, "buffer must be a contiguous 1-D"),
        ("runs", "dtype", lambda r: r.to(torch.int32), TypeError, "runs must be int64"),
        ("runs", "rank", lambda r: r.flatten(), ValueError, r"runs must be a contiguous \[max_runs, 4\]"),
        ("runs", "columns", lambda r: r[:, :3], ValueError, r"runs must be a contiguous \[max_runs, 4\]"),
        ("runs", "column_major", lambda r: r.t().contiguous().t(), ValueError, "runs must be a contiguous"),
        ("run_count", "dtype", lambda c: c.to(torch.int64), TypeError, "run_count must be int32"),
        ("run_count", "size", lambda c: torch.cat([c, c]), ValueError, "run_count must have 1 elements"),
        ("run_count", "rank", lambda c: c.view(1, 1), ValueError, "run_count must be 1-D"),
        ("tensors", "too_many", lambda ts: ts + ts[:2], ValueError, "{list} must hold at most 4 tensors"),
        ("tensors", "rank", lambda ts: [ts[0].flatten()] + ts[1:], ValueError, r"{list}\[0\] must be a 2-D"),
        ("tensors", "no_width", lambda ts: [ts[0][:, :0]] + ts[1:], ValueError, r"{list}\[0\] must be a 2-D"),
        ("tensors", "strided_row", lambda ts: [ts[0][:, ::2]] + ts[1:], ValueError,
         r"{list}\[0\] .*" + contiguous_rows),
        ("tensors", "overlapping_rows", lambda ts: ts[:1] + [ts[1].as_strided((40, 3), (1, 1))] + ts[2:],
         ValueError, r"{list}\[1\] .*" + contiguous_rows),
    ]


def call(op, args):
    getattr(ukv_torch, op)(args["tensors"], args["runs"], args["run_count"], args["buffer"])


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
@pytest.mark.parametrize("name,label,breaker,exc,fragment", bad_arguments(),
                         ids=[f"{a[0]}-{a[1]}" for a in bad_arguments()])
def test_bad_argument_is_refused_by_name_with_nothing_written(op, name, label, breaker, exc, fragment):
    args = valid_args()
    args[name] = breaker(args[name])
    fragment = fragment.format(list="sources" if op == "gather_rows" else "targets")
    before = [t.clone() for t in args["tensors"]] + [args["buffer"].clone()]
    with pytest.raises(exc, match=f"{op}: {fragment}"):
        call(op, args)
    after = list(args["tensors"]) + [args["buffer"]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
@pytest.mark.parametrize("name", ["tensors", "runs", "run_count", "buffer"])
def test_argument_on_the_meta_device(op, name):
    args = valid_args()
    args[name] = [t.to("meta") for t in args[name]] if name == "tensors" else args[name].to("meta")
    with pytest.raises(RuntimeError, match=f"{op}: .*must be on cpu like the other arguments"):
        call(op, args)


# ------------------------------------------------------------- opcheck, compile --
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_opcheck(device, op):
    args = valid_args(device)
    tensors = [t.contiguous() for t in args.pop("tensors")]  # opcheck compares tensors it can clone as they are
    torch.library.opcheck(getattr(torch.ops.ukv, op).default, (tensors,), args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_and_scatter_compiled(backend):
    def program(a, b, runs, count, buffer, c, d):
        ukv_torch.gather_rows([a, b], runs, count, buffer)
        ukv_torch.scatter_rows([c, d], runs, count, buffer)
        return buffer.sum()

    torch._dynamo.reset()
    compiled = torch.compile(program, fullgraph=True, backend=backend)
    for seed in range(3):
        tensors = make_tensors("cpu")[:2]
        runs, nbytes = random_runs(random.Random(seed), tensors, 12)
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        targets = [torch.zeros_like(t) for t in tensors]
        compiled(*tensors, *run_tensors(runs, len(runs), "cpu"), buffer, *targets)
        assert torch.equal(buffer, reference_gather(tensors, runs, len(runs), nbytes, fill=0))
        for i, t in enumerate(tensors):
            for tensor, first, rows, _ in runs:
                if tensor == i:
                    assert torch.equal(targets[i][first: first + rows], t[first: first + rows])


# --------------------------------------------------------------------------- GPU --
def on_gpu(tensors):
    """The tensors on the GPU, the strided one keeping its row stride."""
    return [t.cuda() if t.is_contiguous() else
            torch.zeros(t.shape[0], 20, dtype=t.dtype, device="cuda")[:, :12].copy_(t) for t in tensors]


def assert_scatter_restores(sources, runs_t, count, buffer, originals, runs):
    """scatter_rows of the buffer into zeroed tensors like sources puts every run's rows of originals back."""
    targets = [torch.zeros_like(s) for s in sources]
    ukv_torch.scatter_rows(targets, runs_t, count, buffer)
    for i, t in enumerate(originals):
        for tensor, first, n, _ in runs:
            if tensor == i:
                assert torch.equal(targets[i][first: first + n].cpu(), t[first: first + n])


MAX_RUNS = 256


def padded_runs(seed, tensors):
    """Random runs padded to MAX_RUNS rows (the padding lies past the count)."""
    runs, nbytes = random_runs(random.Random(seed), tensors, 120)
    return runs, runs + [[0, 0, 0, 0]] * (MAX_RUNS - len(runs)), nbytes


@pytest.mark.gpu
def test_gpu_round_trip_matches_the_reference_and_allocates_nothing():
    tensors = make_tensors("cpu", rows=400)
    for seed in range(4):
        runs, nbytes = random_runs(random.Random(seed), tensors, 200)
        sources = on_gpu(tensors)
        buffer = torch.full((nbytes,), 7, dtype=torch.uint8, device="cuda")
        runs_t, count = run_tensors(runs, len(runs), "cuda")
        targets = [torch.zeros_like(t) for t in sources]
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        ukv_torch.gather_rows(sources, runs_t, count, buffer)
        ukv_torch.scatter_rows(targets, runs_t, count, buffer)
        assert torch.cuda.memory_allocated() == allocated
        torch.cuda.synchronize()
        assert torch.equal(buffer.cpu(), reference_gather(tensors, runs, len(runs), nbytes))
        for i, t in enumerate(tensors):
            for tensor, first, rows, _ in runs:
                if tensor == i:
                    assert torch.equal(targets[i][first: first + rows].cpu(), t[first: first + rows])


@pytest.mark.gpu
def test_gpu_long_runs_of_strided_rows():
    """Runs the GPU cuts into chunks of its whole grid: a run of 29K strided
    rows (every fifth row of a tensor), one of 40K contiguous rows, and short
    runs beside them, gathered and scattered back, against the CPU."""
    strided = torch.randint(0, 256, (150000, 448), dtype=torch.uint8)[::5]  # rows 5 * 448 bytes apart
    rows = [strided, torch.randint(0, 256, (50000, 128), dtype=torch.uint8)]
    runs, offset = [], 0
    for tensor, first, count in ((0, 10, 29000), (1, 5000, 40000), (0, 29500, 7), (1, 3, 9)):
        runs.append([tensor, first, count, offset])
        offset += count * rows[tensor].shape[1]
    buffer = torch.zeros(offset, dtype=torch.uint8, device="cuda")
    sources = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda").copy_(t) for t in rows]
    runs_t, count = run_tensors(runs, len(runs), "cuda")
    ukv_torch.gather_rows(sources, runs_t, count, buffer)
    assert torch.equal(buffer.cpu(), reference_gather(rows, runs, len(runs), offset, fill=0))
    assert_scatter_restores(sources, runs_t, count, buffer, rows, runs)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_gpu_thousands_of_short_runs_of_mixed_alignment(seed):
    """More runs than a block lays out at once (256), of 1-70 rows, so that
    a block's share crosses many runs and batches of them: 16-byte rows
    (copied as vectors) beside 12-byte strided and 6-byte rows (copied as
    bytes), at buffer offsets that break the alignment of some runs.
    Gathered and scattered back, against the CPU."""
    rng = random.Random(seed)
    rows_each = 120000
    tensors = [torch.randint(0, 256, (rows_each, 448), dtype=torch.uint8),
               torch.randint(0, 256, (rows_each, 20), dtype=torch.uint8)[:, :12],
               torch.randn(rows_each, 3).to(torch.bfloat16)]
    runs, offset, free = [], 0, [list(range(0, rows_each - 70 + 1, 70)) for _ in tensors]
    for i in range(3000):
        tensor = i % 3 if i % 7 else 0
        first = free[tensor].pop(rng.randrange(len(free[tensor])))
        rows = rng.randint(1, 70)
        runs.append([tensor, first, rows, offset])
        offset += rows * row_bytes(tensors[tensor]) + (rng.randrange(3) if tensor else 0)
    sources = on_gpu(tensors)
    buffer = torch.full((offset,), 7, dtype=torch.uint8, device="cuda")
    runs_t, count = run_tensors(runs, len(runs), "cuda")
    ukv_torch.gather_rows(sources, runs_t, count, buffer)
    assert torch.equal(buffer.cpu(), reference_gather(tensors, runs, len(runs), offset))
    assert_scatter_restores(sources, runs_t, count, buffer, tensors, runs)


@pytest.mark.gpu
def test_gpu_a_list_of_tens_of_thousands_of_runs():
    """More runs than 64 for each block of the copy grid (three blocks a
    multiprocessor), so every thread of a block sums a long group of them
    to find the block's share: short runs of mixed alignment, a few outside
    their tensor or the buffer (skipped), and padding past the count.
    Gathered and scattered back, against the CPU."""
    rng = random.Random(5)
    grid = 3 * torch.cuda.get_device_properties(0).multi_processor_count
    n = 64 * grid + 1000
    slot = 8
    rows_each = (-(-n // 3) + 64) * slot  # a free slot of rows for every run of each tensor, and spare
    tensors = [torch.randint(0, 256, (rows_each, 448), dtype=torch.uint8),
               torch.randint(0, 256, (rows_each, 20), dtype=torch.uint8)[:, :12],
               torch.randn(rows_each, 3).to(torch.bfloat16)]
    free = [list(range(0, rows_each - slot + 1, slot)) for _ in tensors]
    for f in free:
        rng.shuffle(f)
    runs, offset = [], 0
    for i in range(n):
        tensor = i % 3
        rows = rng.randint(1, slot)
        runs.append([tensor, free[tensor].pop(), rows, offset])
        offset += rows * row_bytes(tensors[tensor]) + (rng.randrange(3) if tensor else 0)
    for i in rng.sample(range(n), 20):  # outside the tensor, or past the buffer's end
        runs[i] = [runs[i][0], rows_each, 1, runs[i][3]] if i % 2 else [runs[i][0], 0, 1, offset + 1]
    count = n - 7
    sources = on_gpu(tensors)
    buffer = torch.full((offset,), 7, dtype=torch.uint8, device="cuda")
    runs_t, count_t = run_tensors(runs + [[0, 0, 5, 0]] * 9, count, "cuda")
    ukv_torch.gather_rows(sources, runs_t, count_t, buffer)
    assert torch.equal(buffer.cpu(), reference_gather(tensors, runs, count, offset))
    targets = [torch.zeros_like(t) for t in sources]
    ukv_torch.scatter_rows(targets, runs_t, count_t, buffer)
    expected = [torch.zeros_like(t) for t in tensors]
    for tensor, first, rows, at in runs[:count]:
        t = tensors[tensor]
        if first + rows <= t.shape[0] and at + rows * row_bytes(t) <= offset:
            expected[tensor][first: first + rows] = t[first: first + rows]
    for target, want in zip(targets, expected):
        assert torch.equal(target.cpu(), want)


@pytest.mark.gpu
def test_gpu_graph_replays_read_new_runs_and_counts():
    """Captured once on static run buffers; each replay reads the runs and the count they hold then."""
    tensors = make_tensors("cpu", rows=400)
    sources = on_gpu(tensors)
    _, first, nbytes = padded_runs(0, tensors)
    runs_t = torch.tensor(first, dtype=torch.int64, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    buffer = torch.zeros(4 * nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ukv_torch.gather_rows(sources, runs_t, count, buffer)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ukv_torch.gather_rows(sources, runs_t, count, buffer)
    for seed in range(1, 6):
        runs, padded, nbytes = padded_runs(seed, tensors)
        runs_t.copy_(torch.tensor(padded, dtype=torch.int64))
        count.fill_(len(runs))
        buffer.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(buffer.cpu(), reference_gather(tensors, runs, len(runs), buffer.numel())), seed


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_compiled(mode):
    """As an engine compiles a step: the buffer and the destination tensors are
    persistent and marked static (inductor's cudagraphs take no mutated input
    that is not a static address; KV tensors that are module buffers are static
    too), and the runs change from call to call."""
    def program(a, b, runs, count, buffer, c, d):
        ukv_torch.gather_rows([a, b], runs, count, buffer)
        ukv_torch.scatter_rows([c, d], runs, count, buffer)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(program, fullgraph=True, mode=mode)
    tensors = make_tensors("cpu", rows=400)[:2]
    cases = [random_runs(random.Random(seed), tensors, 100) for seed in range(3)]
    buffer = torch.zeros(max(nbytes for _, nbytes in cases), dtype=torch.uint8, device="cuda")
    targets = [torch.zeros_like(t, device="cuda") for t in tensors]
    for t in (buffer, *targets):
        torch._dynamo.mark_static_address(t)
    for runs, nbytes in cases:
        buffer.zero_()
        for t in targets:
            t.zero_()
        padded = runs + [[0, 0, 0, 0]] * (100 - len(runs))  # one shape for every call: no recompile
        compiled(*on_gpu(tensors), *run_tensors(padded, len(runs), "cuda"), buffer, *targets)
        torch.cuda.synchronize()
        assert torch.equal(buffer[:nbytes].cpu(), reference_gather(tensors, runs, len(runs), nbytes, fill=0))
        for i, t in enumerate(tensors):
            for tensor, first, rows, _ in runs:
                if tensor == i:
                    assert torch.equal(targets[i][first: first + rows].cpu(), t[first: first + rows])
    if mode == "reduce-overhead":
        assert torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0) == 0
