"""A/B timing of csa_translate_pack kernel variants and tile shapes (GPU machine;
a development tool: device time is scarce, so one call should build, check and
time every variant worth trying).

A variant is the tree's csrc/kernels with textual patches (VARIANTS below; a
patch that no longer matches the source stops the build, so a stale variant
cannot silently measure the baseline). Each is compiled with nvcc into a small
shared library around the launchers (csa_ab_entry.cu) and called through
ctypes on torch tensors, so inputs come from the caching allocator and the
timing is bench_kernels.py's: 20 calls per captured graph, the median of 5
runs of replays. That figure moves between captures of the same call (the
eighth session saw 1.88-2.16 us at T=512), so every (case, variant, shape) is
captured --captures times, the captures of all variants taking turns, and the
table gives the median with the range. Every output is first checked against
bench_kernels.py's plain-torch composite.

    python benchmarks/csa_ab.py --variants base,late_trigger [--captures 7] [--out ab.json]

Needs ukv_torch built (the inputs' indptrs come from its metadata ops) and nvcc.
"""
import argparse
import concurrent.futures
import ctypes
import json
import pathlib
import shutil
import statistics
import subprocess
import sys

import torch

import bench_kernels as bk

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "csa_ab"
ENTRY = pathlib.Path(__file__).resolve().parent / "csa_ab_entry.cu"
SHAPES = {0: "product", 1: "256x1", 2: "128x2", 3: "64x4", 4: "128x1", 5: "64x1"}

# The PDL trigger: where a kernel lets the next kernel of the stream be launched.
TRIGGER = "  cudaTriggerProgrammaticLaunchCompletion();\n"
TRANSLATED = "    translate_tile(cells, row_of, rows);\n"
COMPACT_LOOKUP = "  if (kCompact) return row.table[static_cast<uint32_t>(row.first) + static_cast<uint32_t>(col)];"
TOPK_LOAD = "*reinterpret_cast<const int4*>(p.topk + offset)"
TOPK_GROUP = f"unpack_group(lane < tile_lanes ? {TOPK_LOAD} : make_int4(0, 0, 0, 0),"
GROUP_STORE = "          *reinterpret_cast<int4*>(p.out.data + first + lane) = group;"


def table_lookup_via(intrinsic):
    """The compact table lookup through a load intrinsic (__ldg, __ldcg) in
    device code; the host pass keeps the plain read."""
    return (COMPACT_LOOKUP, "#ifdef __CUDA_ARCH__\n" + COMPACT_LOOKUP.replace(
        "return row.table[static_cast<uint32_t>(row.first) + static_cast<uint32_t>(col)]",
        f"return {intrinsic}(row.table + (static_cast<uint32_t>(row.first) + static_cast<uint32_t>(col)))")
        + "\n#endif\n" + COMPACT_LOOKUP)


def topk_load_via(intrinsic):
    """The 16-byte top-k group load through a load intrinsic (__ldg, __ldcs)."""
    return (TOPK_GROUP, TOPK_GROUP.replace(TOPK_LOAD, f"{intrinsic}(reinterpret_cast<const int4*>(p.topk + offset))"))


# name -> {file under csrc: [(old, new), ...]}
VARIANTS = {
    "base": {},
    # the trigger at the block's exit (implicit): the next grid is placed only
    # once every block of this one has finished
    "late_trigger": {"kernels/compat.h": [(TRIGGER, "")]},
    # the trigger once a block's lookups are issued, before its stores
    "mid_trigger": {"kernels/compat.h": [(TRIGGER, "")],
                    "kernels/csa_translate_pack.cuh": [(TRANSLATED, TRANSLATED + TRIGGER.replace("  ", "    ", 1))]},
    "no_pdl": {"kernels/compat.h": [("config.numAttrs = current_device_overlaps_launches() ? 1 : 0;",
                                     "config.numAttrs = 0;")]},
    # table lookups through the read-only path (LDG.E.CONSTANT)
    "ldg_table": {"kernels/index_formulas.h": [table_lookup_via("__ldg")]},
    "ldg_all": {"kernels/index_formulas.h": [table_lookup_via("__ldg")],
                "kernels/csa_translate_pack.cuh": [topk_load_via("__ldg")]},
    # table lookups cached in L2 only (LDG.E.STRONG.GPU): no L1 allocation or
    # tag check per distinct line of a warp's gather
    "cg_table": {"kernels/index_formulas.h": [table_lookup_via("__ldcg")]},
    # each thread also loads one cell per 16 bytes of the first kThreads * 4
    # table columns, so the row's lines are requested whole (4 sectors) beside
    # the gathers' single sectors; the value is kept alive by a test that never
    # holds on the benchmark's data (a measurement, not a product candidate)
    "row_touch": {"kernels/csa_translate_pack.cuh": [
        ("  const TableRow row = table_row(p.table, bid);\n",
         "  const TableRow row = table_row(p.table, bid);\n"
         "  const int32_t touch_col = static_cast<int32_t>(threadIdx.x) * 4;\n"
         "  const int32_t touch = touch_col < row.cols ? id_at<kCompact>(row, touch_col) : 0;\n"),
        ("    }\n    return;\n  }\n", "    }\n    if (touch == 0x7eadbeef) p.out.data[0] = 0;\n    return;\n  }\n")]},
    # the token's first kTile table columns read with coalesced loads into the
    # tile's shared array (unused on the aligned path) once the batch id is in,
    # and the lookups below them made there: as many round trips as the global
    # gathers, but a row's lines requested once rather than by every warp (a
    # measurement: the aligned path only, columns staged whatever the context)
    "stage_row": {"kernels/csa_translate_pack.cuh": [(
        "    int32_t rows[kVectors][4];\n    translate_tile(cells, row_of, rows);\n",
        "    constexpr int32_t kStagePerThread = kTile / kThreads;\n"
        "    const int32_t staged_cols = min_i32(row.cols, kTile);\n"
        "    int32_t loaded[kStagePerThread];\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < kStagePerThread; ++i) {\n"
        "      const int32_t c = i * kThreads + static_cast<int32_t>(threadIdx.x);\n"
        "      loaded[i] = c < staged_cols ? id_at<kCompact>(row, c) : 0;\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < kStagePerThread; ++i) staged[i * kThreads + threadIdx.x] = loaded[i];\n"
        "    __syncthreads();\n"
        "    const auto staged_row_of = [&](int32_t entry) {\n"
        "      const int32_t e = max_i32(min_i32(entry, row.cols * p.rows_per_block.value - 1), 0);\n"
        "      const int32_t q = quotient(e, p.rows_per_block);\n"
        "      const uint32_t id = static_cast<uint32_t>(q < kTile ? staged[q] : id_at<kCompact>(row, q));\n"
        "      return static_cast<int32_t>((id - static_cast<uint32_t>(q)) * static_cast<uint32_t>(p.rows_per_block.value)\n"
        "                                  + (static_cast<uint32_t>(p.compress_base) + static_cast<uint32_t>(e)));\n"
        "    };\n"
        "    int32_t rows[kVectors][4];\n    translate_tile(cells, staged_row_of, rows);\n")]},
    # the floor of the decode work at 256x1: a token's top-k, batch id and slice
    # start loaded in one round trip, its table row gathered in the next, the
    # rows stored, and nothing else (no skip, valid_k, clamp or bounds; k = 32
    # as a shift). Correct only for full, in-range decode rows, which every
    # decode case from T=64 up is; the other cases run the base kernel.
    "floor": {"kernels/csa_translate_pack.cuh": [(
        "  gpu::after_prior_kernels();\n  constexpr int32_t kTile",
        "  gpu::after_prior_kernels();\n"
        "  if constexpr (kSource != SkipSource::kPerToken && kCompact && kVectorRows && kThreads == 256 &&\n"
        "                kVectors == 1) {\n"
        "    const int32_t token = blockIdx.x, lane = static_cast<int32_t>(threadIdx.x) * 4;\n"
        "    const uint32_t from = static_cast<uint32_t>(token * static_cast<int32_t>(p.topk_row_stride) + lane);\n"
        "    const int4 g = *reinterpret_cast<const int4*>(p.topk + from);\n"
        "    const int32_t seq = p.batch_id[token];\n"
        "    const int32_t first = p.out.indptr[token];\n"
        "    const uint32_t row = static_cast<uint32_t>(seq * static_cast<int32_t>(p.table.row_stride));\n"
        "    const auto at = [&](int32_t e) {\n"
        "      return p.table.data[row + (static_cast<uint32_t>(e) >> 5)] * 32 + (e & 31) + p.compress_base;\n"
        "    };\n"
        "    *reinterpret_cast<int4*>(p.out.data + static_cast<uint32_t>(first + lane)) =\n"
        "        make_int4(at(g.x), at(g.y), at(g.z), at(g.w));\n"
        "    return;\n"
        "  }\n"
        "  constexpr int32_t kTile")]},
    # streaming (evict-first) top-k loads and output stores
    "stream_io": {"kernels/csa_translate_pack.cuh": [
        topk_load_via("__ldcs"),
        (GROUP_STORE, "          __stcs(reinterpret_cast<int4*>(p.out.data + first + lane), group);")]},
}


def write_variant(name: str) -> pathlib.Path:
    """build/csa_ab/<name>/csrc: csrc/kernels and core/ceil_div.h, patched."""
    src = BUILD / name / "csrc"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "csrc" / "kernels", src / "kernels")
    (src / "core").mkdir(parents=True)
    shutil.copy(ROOT / "csrc" / "core" / "ceil_div.h", src / "core" / "ceil_div.h")
    for rel, patches in VARIANTS[name].items():
        path = src / rel
        text = path.read_text()
        for old, new in patches:
            if text.count(old) != 1:
                raise SystemExit(f"variant {name}: {rel}: the patch matches {text.count(old)} times: {old!r}")
            text = text.replace(old, new)
        path.write_text(text)
    return src


def build(name: str, arch: str) -> pathlib.Path:
    src = write_variant(name)
    lib = BUILD / name / "csa_ab.so"
    cmd = ["nvcc", "-std=c++17", "-O3", f"-arch={arch}", "-Xcompiler", "-fPIC", "-shared", "-cudart", "static",
           f"-I{src}", str(ENTRY), "-o", str(lib)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"variant {name}: nvcc failed:\n{done.stderr}")
    return lib


def cases(device):
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    dec = lambda t, ctx_k: (bk.decode_batch(t, ctx_k * 1024, device, gen), False)
    pre = lambda t, start_k: (bk.prefill_batch(t, start_k * 1024, device, gen), True)
    return {"decode T=1 ctx 8K": dec(1, 8), "decode T=64 ctx 128K": dec(64, 128),
            "decode T=256 ctx 32K": dec(256, 32), "decode T=384 ctx 128K": dec(384, 128),
            "decode T=512 ctx 32K": dec(512, 32), "decode T=512 ctx 64K": dec(512, 64),
            "decode T=512 ctx 128K": dec(512, 128), "decode T=1024 ctx 32K": dec(1024, 32),
            "prefill T=2048 ctx 32K": pre(2048, 30), "prefill T=4096 ctx 64K": pre(4096, 60),
            "prefill T=8192 ctx 64K": pre(8192, 56)}


def caller(lib, d, prefill, out, shape):
    """A no-argument call of the variant's launcher on the current stream. The
    launcher gets raw pointers, so the call holds the tensors they point into:
    without that, the caching allocator hands a finished case's memory to the
    next case while the call still writes there."""
    topk, table = d["topk"], d["csa_table"]
    assert topk.stride(1) == 1 and table.stride(1) == 1 and d["positions"].dtype == torch.int64
    skip = d["prefix_swa_count"] if prefill else None
    ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else None)
    args = [ptr(topk), ctypes.c_int64(topk.stride(0)), ctypes.c_int32(topk.shape[1]), ctypes.c_int32(topk.shape[0]),
            ptr(table), ctypes.c_int32(table.shape[0]), ctypes.c_int32(table.shape[1]), ptr(d["positions"]),
            ptr(d["batch_id"]), ptr(skip), ptr(d["csa_indptr"]), ptr(out), ctypes.c_int64(out.numel()),
            ctypes.c_int32(0 if prefill else bk.WINDOW), ctypes.c_int32(bk.CSA_K), ctypes.c_int32(0),
            ctypes.c_int32(shape)]

    def run(_alive=(d, out)):
        rc = lib.ukv_ab_csa(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc != 0:
            raise RuntimeError(f"launch failed: error {rc}")
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="base", help="comma-separated names from VARIANTS")
    parser.add_argument("--captures", type=int, default=7)
    parser.add_argument("--shapes-of", default="base", help="the variant whose every tile shape is timed too")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", help="also write every sample as JSON to this path")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    with concurrent.futures.ThreadPoolExecutor() as pool:
        libs = dict(zip(names, (ctypes.CDLL(str(p)) for p in pool.map(lambda n: build(n, args.arch), names))))
    device = torch.device("cuda")
    shapes_of = lambda label, name: [0] if label.endswith("T=1 ctx 8K") or name != args.shapes_of else list(range(5))
    runners = {}
    for label, (d, prefill) in cases(device).items():
        reference = bk.csa_case(label, d, prefill)
        reference.run_composite()
        expected = reference.outputs()[1][0]
        for name in names:
            for shape in shapes_of(label, name):
                out = bk.buffer(d["csa_indptr"])
                run = caller(libs[name], d, prefill, out, shape)
                run()
                if not torch.equal(out[:-1], expected):
                    raise SystemExit(f"{label}: variant {name}, shape {SHAPES[shape]}: wrong output")
                runners[(label, name, shape)] = run
    print(f"every output matches the composite ({len(runners)} runs)", flush=True)
    samples = {key: [] for key in runners}
    for _ in range(args.captures):
        for key, run in runners.items():
            samples[key].append(bk.time_graph(run, 2000))
    rows = [{"case": c, "variant": n, "shape": SHAPES[s], "us": xs} for (c, n, s), xs in samples.items()]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "rows": rows}, f, indent=1)
    print(f"\ngraph us per call (20/graph): median [min-max] of {args.captures} captures\n")
    print("| case | shape | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for label in dict.fromkeys(c for c, _, _ in runners):
        for shape in shapes_of(label, args.shapes_of):
            cells = [samples.get((label, n, shape)) for n in names]
            print(f"| {label} | {SHAPES[shape]} | " + " | ".join(
                f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs else "-" for xs in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
