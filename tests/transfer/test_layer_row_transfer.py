"""gather_rows and scatter_rows with layer_offsets: the same runs over several
layers' tensors in one call, against a per-layer reference (each layer's
runs at its offset); the layers' shapes, offsets and counts checked by name
with nothing written; runs outside a layer's part of the buffer, and writes
that collide across layers, refused on the host and skipped on the GPU;
a target given for two layers refused, and views of one plane at different
base rows (the row space's layers) taken where their runs write apart;
graph capture and opcheck."""
import random

import pytest
import torch

import ukv_torch
from support.devices import DEVICES
from support.row_runs import random_runs, row_bytes, run_tensors


def make_layers(device, layers, rows=40, seed=0):
    """Per layer an fp32 plane, a bf16 plane and an indexer-like strided uint8 view, all layers alike
    but, where ``rows`` is a list, in their rows (layer l's planes have rows[l])."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for rows in rows if isinstance(rows, list) else [rows] * layers:
        wide = torch.randn(rows, 5, generator=g)
        narrow = torch.randn(rows, 3, generator=g).to(torch.bfloat16)
        indexer = torch.randint(0, 255, (rows // 2, 20), dtype=torch.uint8, generator=g)[:, :12]
        out.append([wide.to(device), narrow.to(device),
                    indexer.to(device) if device == "cpu" else
                    torch.zeros(rows // 2, 20, dtype=torch.uint8, device=device)[:, :12].copy_(indexer)])
    return out


def packed(t, first, rows):
    return t[first: first + rows].contiguous().view(torch.uint8).flatten().cpu()


def reference_gather(layers, runs, offsets, nbytes, fill=7):
    """Layer by layer, each layer's runs into the buffer at its offset."""
    buffer = torch.full((nbytes,), fill, dtype=torch.uint8)
    for tensors, shift in zip(layers, offsets):
        for tensor, first, rows, offset in runs:
            n = rows * row_bytes(tensors[tensor])
            buffer[shift + offset: shift + offset + n] = packed(tensors[tensor], first, rows)
    return buffer


def flat(layers):
    return [t for tensors in layers for t in tensors]


def zeros_like_layers(layers):
    return [[torch.zeros_like(t) if t.is_contiguous() else
             torch.zeros(t.shape[0], 20, dtype=t.dtype, device=t.device)[:, :12] for t in tensors]
            for tensors in layers]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers", [1, 2, 7])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rows_differ", [False, True])
def test_layers_gather_and_scatter_like_one_call_per_layer(device, num_layers, seed, rows_differ):
    """With rows_differ the layers' rows differ by a few, as the row space's do, and the
    runs are drawn over the fewest (layer 1's, where there is one)."""
    rng = random.Random(seed)
    rows = [40 + (4 if l != 1 else 0) + 2 * (l % 3) for l in range(num_layers)] if rows_differ else 40
    layers = make_layers(device, num_layers, rows=rows, seed=seed)
    runs, span = random_runs(rng, layers[1 if rows_differ and num_layers > 1 else 0], 20)
    offsets = [rng.randrange(1, 40)]  # layer 0 at an offset too: a single layer's offset is honoured
    for _ in range(num_layers - 1):
        offsets.append(offsets[-1] + span + rng.randrange(5))  # gaps between the layers stay untouched
    nbytes = offsets[-1] + span + 3
    buffer = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    ukv_torch.gather_rows(flat(layers), *run_tensors(runs, len(runs), device), buffer, layer_offsets=offsets)
    cpu_layers = [[t.cpu() for t in tensors] for tensors in layers]
    assert torch.equal(buffer.cpu(), reference_gather(cpu_layers, runs, offsets, nbytes))

    targets = zeros_like_layers(layers)
    ukv_torch.scatter_rows(flat(targets), *run_tensors(runs, len(runs), device), buffer, layer_offsets=offsets)
    for l, (tensors, written) in enumerate(zip(cpu_layers, targets)):
        for i, t in enumerate(tensors):
            rows = {r for k, first, n, _ in runs if k == i for r in range(first, first + n)}
            for r in range(t.shape[0]):
                want = t[r] if r in rows else torch.zeros_like(t[r])
                assert torch.equal(written[i][r].cpu(), want), (l, i, r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_one_layer_at_an_offset_is_the_call_on_the_buffer_from_there(device, op):
    """What the tier objects do for a layer alone of its shape: its offset must not be dropped."""
    layers = make_layers(device, 1)
    runs, nbytes = random_runs(random.Random(9), layers[0], 12)
    buffer = torch.randint(0, 256, (nbytes + 48,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)).to(device)
    tensors = layers[0] if op == "gather_rows" else zeros_like_layers(layers)[0]
    twin_buffer, twin_tensors = buffer.clone(), [t.clone() for t in tensors]
    getattr(ukv_torch, op)(tensors, *run_tensors(runs, len(runs), device), buffer, layer_offsets=[48])
    getattr(ukv_torch, op)(twin_tensors, *run_tensors(runs, len(runs), device), twin_buffer[48:])
    assert torch.equal(buffer, twin_buffer)
    assert all(torch.equal(a, b) for a, b in zip(tensors, twin_tensors))


@pytest.mark.parametrize("device", DEVICES)
def test_layer_offsets_none_is_one_layer_at_zero(device):
    layers = make_layers(device, 1)
    runs, nbytes = random_runs(random.Random(5), layers[0], 12)
    a = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    b = a.clone()
    ukv_torch.gather_rows(layers[0], *run_tensors(runs, len(runs), device), a)
    ukv_torch.gather_rows(layers[0], *run_tensors(runs, len(runs), device), b, layer_offsets=[0])
    assert torch.equal(a, b)


def _args(layers=3, runs=((0, 0, 2, 0), (1, 3, 1, 40)), offsets=(0, 60, 120), nbytes=200):
    """Valid CPU arguments: three layers, two runs of 40 and 6 bytes each."""
    return dict(tensors=flat(make_layers("cpu", layers)), runs=[list(r) for r in runs], offsets=list(offsets),
                buffer=torch.full((nbytes,), 7, dtype=torch.uint8))


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
@pytest.mark.parametrize("change, fragment", [
    (dict(offsets=[]), r"layer_offsets must hold 1 to 64 offsets"),
    (dict(offsets=list(range(0, 65 * 2, 2)), nbytes=4000), r"layer_offsets must hold 1 to 64 offsets"),
    (dict(offsets=[0, 60]), r"must hold at most 4 tensors for each of the 2 layers, the same number each, got 9"),
    (dict(offsets=[0, 60, 201]), r"layer_offsets\[2\] must lie in the 200-byte buffer, got 201"),
    (dict(offsets=[0, -1, 60]), r"layer_offsets\[1\] must lie in the 200-byte buffer, got -1"),
    (dict(offsets=[0, 60, 170]), r"runs\[0\] = \(0, 0, 2, 0\) must name .* \(in layer 2, at its layer offset 170; "),
])
def test_bad_layers_are_refused_by_name_with_nothing_written(op, change, fragment):
    a = _args(nbytes=change.get("nbytes", 200))
    a["offsets"] = change["offsets"]
    before = [t.clone() for t in a["tensors"]]
    with pytest.raises(ValueError, match=rf"{op}: .*{fragment}"):
        getattr(ukv_torch, op)(a["tensors"], *run_tensors(a["runs"], 2, "cpu"), a["buffer"],
                               layer_offsets=a["offsets"])
    assert a["buffer"].tolist() == [7] * a["buffer"].numel()
    assert all(torch.equal(x, y) for x, y in zip(a["tensors"], before))


def test_layers_gathering_into_the_same_bytes_are_refused():
    """Layer 1's first run (30-70) lands on layer 0's (0-40): one layer's bytes would be lost."""
    a = _args(offsets=(0, 30, 120))
    with pytest.raises(ValueError, match=r"gather_rows: runs\[0\] of layer 0 and runs\[0\] of layer 1 write the "
                                         r"same buffer bytes"):
        ukv_torch.gather_rows(a["tensors"], *run_tensors(a["runs"], 2, "cpu"), a["buffer"], layer_offsets=a["offsets"])
    assert a["buffer"].tolist() == [7] * 200
    # Scattering reads those bytes for both layers, into each layer's own rows: allowed.
    targets = flat(zeros_like_layers(make_layers("cpu", 3)))
    ukv_torch.scatter_rows(targets, *run_tensors(a["runs"], 2, "cpu"), a["buffer"], layer_offsets=a["offsets"])
    assert torch.equal(targets[3][0:2].contiguous().view(torch.uint8).flatten(), a["buffer"][30:70])


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_a_layer_shaped_unlike_layer_0_is_refused(op):
    a = _args()
    a["tensors"][4] = torch.zeros(40, 4).to(torch.bfloat16)  # layer 1's bf16 plane, 8 bytes a row instead of 6
    with pytest.raises(ValueError, match=rf"{op}: .*\[4\] \(layer 1\) must have the row bytes and row stride "
                                         r"of .*\[1\] \(6, 6\), got \(8, 8\)"):
        getattr(ukv_torch, op)(a["tensors"], *run_tensors(a["runs"], 2, "cpu"), a["buffer"],
                               layer_offsets=a["offsets"])
    assert a["buffer"].tolist() == [7] * 200


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_a_run_past_the_fewest_rows_of_the_layers_is_refused_on_the_host_and_skipped_on_the_gpu(device, op):
    """Layer 1 has 38 rows, the others 40: a run of rows 37-38 lies in layers 0 and 2 but not in
    layer 1, and every layer takes the same runs."""
    layers = make_layers(device, 3, rows=[40, 38, 40])
    runs = [[0, 0, 2, 0], [0, 37, 2, 40]]  # 40 bytes each
    buffer = torch.randint(0, 256, (240,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)).to(device)
    tensors = flat(layers) if op == "gather_rows" else flat(zeros_like_layers(layers))
    before_buffer, before = buffer.clone(), [t.clone() for t in tensors]
    call = lambda count: getattr(ukv_torch, op)(tensors, *run_tensors(runs, count, device), buffer,
                                                layer_offsets=[0, 80, 160])
    if device == "cpu":
        with pytest.raises(ValueError, match=rf"{op}: runs\[1\] = \(0, 37, 2, 40\) must name .* a tensor's rows "
                                             r"are the fewest any layer's has"):
            call(2)
        assert torch.equal(buffer, before_buffer) and all(torch.equal(x, y) for x, y in zip(tensors, before))
        return
    call(2)  # run 1 skipped in every layer: what run 0 alone does
    got_buffer, got = buffer.clone(), [t.clone() for t in tensors]
    buffer.copy_(before_buffer)
    for t, b in zip(tensors, before):
        t.copy_(b)
    call(1)
    assert torch.equal(got_buffer, buffer) and all(torch.equal(x, y) for x, y in zip(got, tensors))
    changed = not torch.equal(buffer, before_buffer) if op == "gather_rows" else \
        not all(torch.equal(x, y) for x, y in zip(tensors, before))
    assert changed  # run 0 was copied


@pytest.mark.parametrize("device", DEVICES)
def test_a_scatter_target_given_for_two_layers_is_refused(device):
    """Every layer's runs write the same rows: a tensor given for two layers would keep one layer's bytes."""
    layers = make_layers(device, 2)
    layers[1][0] = layers[0][0]
    buffer = torch.full((200,), 7, dtype=torch.uint8, device=device)
    before = [t.clone() for t in flat(layers)]
    with pytest.raises(ValueError, match=r"scatter_rows: targets\[0\] and targets\[3\] \(tensor 0 of layers 0 and "
                                         r"1\) start at the same address"):
        ukv_torch.scatter_rows(flat(layers), *run_tensors([[0, 0, 1, 0]], 1, device), buffer, layer_offsets=[0, 100])
    assert all(torch.equal(x, y) for x, y in zip(flat(layers), before))
    # Gathering reads them: allowed, and both layers give the same bytes.
    ukv_torch.gather_rows(flat(layers), *run_tensors([[0, 0, 1, 0]], 1, device), buffer, layer_offsets=[0, 100])
    assert torch.equal(buffer[:20], buffer[100:120])


@pytest.mark.parametrize("device", DEVICES)
def test_layers_viewing_one_plane_at_different_base_rows_scatter_where_their_runs_write_apart(device):
    """The row space's layers are views of one plane starting a few rows apart. In a 40-row
    plane, layer 0 starts at row 0 and layer 1 at row 10: runs over rows 0-4 and 20-24
    write plane rows 0-4 and 20-24 for layer 0, 10-14 and 30-34 for layer 1, all apart,
    and the call is one call per layer. A third run over rows 10-14 writes plane rows
    10-14 for layer 0, which layer 1's first run writes too: refused on the host, naming
    both, with nothing written."""
    plane = torch.zeros(40, 6, dtype=torch.float32, device=device)
    layers = [[plane[0:]], [plane[10:]]]
    runs = [[0, 0, 5, 0], [0, 20, 5, 120]]  # 120 bytes each
    buffer = torch.randint(0, 256, (480,), dtype=torch.uint8, generator=torch.Generator().manual_seed(4)).to(device)
    ukv_torch.scatter_rows(flat(layers), *run_tensors(runs, 2, device), buffer, layer_offsets=[0, 240])
    want = torch.zeros(40, 6)
    for base, shift in ((0, 0), (10, 240)):
        for _, first, rows, offset in runs:
            packed_rows = buffer[shift + offset: shift + offset + rows * 24].cpu().view(torch.float32)
            want[base + first: base + first + rows] = packed_rows.view(rows, 6)
    assert torch.equal(plane.cpu(), want)
    if device == "cpu":
        before = plane.clone()
        with pytest.raises(ValueError, match=r"scatter_rows: runs\[2\] of layer 0 and runs\[0\] of layer 1 write "
                                             r"the same tensor rows"):
            ukv_torch.scatter_rows(flat(layers), *run_tensors(runs + [[0, 10, 5, 0]], 3, device), buffer,
                                   layer_offsets=[0, 240])
        assert torch.equal(plane, before)


@pytest.mark.gpu
def test_gpu_runs_past_a_layers_part_of_the_buffer_are_skipped_for_that_layer():
    """On the device the runs are not read by the host: a run that fits layer 0's offset but not
    layer 2's is copied for layers 0 and 1 only."""
    layers = make_layers("cuda", 3)
    runs = [[0, 0, 2, 0], [1, 3, 1, 40]]  # 40 and 6 bytes
    offsets = [0, 60, 120]
    buffer = torch.full((160,), 7, dtype=torch.uint8, device="cuda")  # layer 2's first run (120-160) fits, its second (160-166) not
    ukv_torch.gather_rows(flat(layers), *run_tensors(runs, 2, "cuda"), buffer, layer_offsets=offsets)
    cpu_layers = [[t.cpu() for t in tensors] for tensors in layers]
    want = reference_gather(cpu_layers, runs[:1], offsets, 160)
    want[40:46] = packed(cpu_layers[0][1], 3, 1)
    want[100:106] = packed(cpu_layers[1][1], 3, 1)
    assert torch.equal(buffer.cpu(), want)


@pytest.mark.gpu
def test_gpu_layers_match_calls_per_layer_over_many_runs_and_allocate_nothing():
    rng = random.Random(3)
    layers = make_layers("cuda", 40, rows=600)
    runs, span = random_runs(rng, layers[0], 300)
    offsets = [l * span for l in range(40)]
    runs_t, count = run_tensors(runs, len(runs), "cuda")
    one = torch.full((40 * span,), 7, dtype=torch.uint8, device="cuda")
    per_layer = one.clone()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    ukv_torch.gather_rows(flat(layers), runs_t, count, one, layer_offsets=offsets)
    assert torch.cuda.memory_allocated() == allocated
    for tensors, shift in zip(layers, offsets):
        ukv_torch.gather_rows(tensors, runs_t, count, per_layer[shift:])
    assert torch.equal(one, per_layer)
    targets = zeros_like_layers(layers)
    ukv_torch.scatter_rows(flat(targets), runs_t, count, one, layer_offsets=offsets)
    for tensors, written in zip(layers, targets):
        for k, first, n, _ in runs:
            assert torch.equal(written[k][first: first + n], tensors[k][first: first + n])


@pytest.mark.gpu
def test_gpu_graph_replays_of_a_layered_gather_read_new_runs():
    layers = make_layers("cuda", 4, rows=200)
    runs, span = random_runs(random.Random(0), layers[0], 40)
    offsets = [l * 2 * span for l in range(4)]
    runs_t = torch.zeros(64, 4, dtype=torch.int64, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    buffer = torch.zeros(8 * span, dtype=torch.uint8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ukv_torch.gather_rows(flat(layers), runs_t, count, buffer, layer_offsets=offsets)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        ukv_torch.gather_rows(flat(layers), runs_t, count, buffer, layer_offsets=offsets)
    cpu_layers = [[t.cpu() for t in tensors] for tensors in layers]
    for seed in range(1, 4):
        runs, _ = random_runs(random.Random(seed), layers[0], 40)
        runs = [r for r in runs if r[3] + r[2] * 20 <= span][:64]
        runs_t.zero_()
        runs_t[:len(runs)] = torch.tensor(runs, dtype=torch.int64)
        count.fill_(len(runs))
        buffer.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(buffer.cpu(), reference_gather(cpu_layers, runs, offsets, buffer.numel())), seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_opcheck_with_layers(device, op):
    layers = make_layers(device, 2)
    runs, span = random_runs(random.Random(2), layers[0], 6)
    buffer = torch.full((2 * span,), 7, dtype=torch.uint8, device=device)
    tensors = flat(layers if op == "gather_rows" else zeros_like_layers(layers))
    torch.library.opcheck(getattr(torch.ops.ukv, op).default,
                          (tensors, *run_tensors(runs, len(runs), device), buffer),
                          {"layer_offsets": [0, span]})
