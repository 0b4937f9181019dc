"""Disaggregated serving in three processes: a router, a prefill engine and a
decode engine (docs/serving-loop.md, "Prefill and decode on different
engines").

The router sends each request to the prefill engine and tells the decode
engine to expect it. The prefill engine computes the prompt and samples the
first token, then moves the sequence's KV into the decode engine's pool over
Mooncake's transfer engine (ukv_torch.disagg; loopback TCP here). The decode
engine decodes it to the end and reports to the router, which may send a
follow-up turn or a repeat (so both engines' prefix caches hit). Both engines
are engine_loop.py's, with its tagged model: every index either one builds,
the decode engine's reads of the rows that travelled included, must read the
tag its position expects.

    python examples/disaggregated.py [--prefill-layout L] [--decode-layout L] [--requests N] [--staging-kib K]
                                     [--device cuda]

Prints one line per engine and one for the router (PASS or FAIL and the
counts); exits 1 on any mismatch, failed transfer or unfinished request.
"""
from __future__ import annotations

import argparse
import random
import select
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

import engine_loop
from engine_loop import Engine, Request, Workload
from ukv_torch import KvManager
from ukv_torch.disagg import Abort, Channel, KvReceiver, KvSender, TransferEndpoint

#: the longest a whole run may take, and any one wait on a peer
RUN_SECONDS = 900
WAIT_SECONDS = 60


def engine(args, layout: str) -> Engine:
    """An engine_loop engine with no workload of its own: requests come from the router."""
    return Engine(engine_loop.parse_args(["--layout", layout, "--requests", "0", "--seed", str(args.seed),
                                          "--device", args.device]))


# --- the prefill engine -------------------------------------------------------------------
class PrefillEngine:
    """Computes prompts; a request whose first token is sampled leaves for the decode engine.
    One the decode engine cannot take now is parked (its KV stays here) and offered again."""

    def __init__(self, args, router: Channel):
        self.engine, self.router = engine(args, args.prefill_layout), router
        self.endpoint = TransferEndpoint()
        if args.fault == "no-bytes":  # every transfer "succeeds" without moving a byte: the check must fail
            submit = self.endpoint.submit
            self.endpoint.submit = lambda peer, writes: submit(peer, writes[:0])
        self.sender = KvSender(self.engine.mgr, self.engine.plan, self.engine.kv, self.endpoint,
                               timeout_s=WAIT_SECONDS, staging_bytes=args.staging_kib << 10)
        self.decode_address = None
        self.parked: List[Request] = []
        self.sent = self.refusals = 0
        router.send(dict(type="hello", role="prefill", max_len=self.engine.workload.max_len))

    def serve(self) -> None:
        deadline = time.monotonic() + RUN_SECONDS
        while time.monotonic() < deadline and not self.engine.failed():
            idle = self.engine.done() and not self.parked
            if self.router.ready(0.05 if idle else 0):
                message = self.router.receive(WAIT_SECONDS)
                if message["type"] == "stop":
                    return self.report()
                self.decode_address = tuple(message["decode"])
                self.engine.waiting.append(Request(message["rid"], message["prompt"], message["target"]))
            self.engine.step()
            self.hand_over([r for r in self.engine.running if r.decoding] + self.parked)
        self.report()

    def hand_over(self, ready: List[Request]) -> None:
        for r in ready:
            result = self.sender.send(r.rid, self.decode_address)
            if r in self.engine.running:
                self.engine.running.remove(r)
            if r in self.parked:
                self.parked.remove(r)
            if result.status == "sent":
                self.sent += 1
                self.router.send(dict(type="sent", rid=r.rid, cached=result.answer))
            elif result.status == "refused" and result.answer == KvManager.NOT_NOW:
                self.refusals += 1
                self.parked.append(r)  # the decode engine's room is in use: offer it again later
            else:
                if self.engine.mgr.has_sequence(r.rid):
                    self.engine.mgr.deallocate(r.rid)
                self.engine.problems.append(f"request {r.rid}: {result.status} ({result.answer}) {result.reason}")

    def report(self) -> None:
        ok, report = self.engine.outcome(0.0)
        report = report.replace("engine_loop:", f"prefill: sent={self.sent} parked_offers={self.refusals}", 1)
        self.router.send(dict(type="summary", ok=ok and not self.parked, report=report))


# --- the decode engine --------------------------------------------------------------------
class DecodeEngine:
    """Decodes the sequences that arrive; reports each finished request to the router."""

    def __init__(self, args, router: Channel):
        self.engine, self.router = engine(args, args.decode_layout), router
        self.endpoint = TransferEndpoint()
        self.receiver = KvReceiver(self.engine.mgr, self.engine.plan, self.engine.kv, self.endpoint,
                                   timeout_s=WAIT_SECONDS, staging_bytes=args.staging_kib << 10)
        self.expected: Dict[int, dict] = {}
        self.arrived, self.stopped = 0, False
        finish = self.engine.finish

        def finish_and_report(done: List[Request]) -> None:
            finish(done)
            for r in done:
                router.send(dict(type="finished", rid=r.rid, tokens=r.tokens, prompt_len=len(r.prompt)))

        self.engine.finish = finish_and_report
        router.send(dict(type="hello", role="decode", address=list(self.receiver.address)))

    def serve(self) -> None:
        deadline = time.monotonic() + RUN_SECONDS
        while time.monotonic() < deadline and not self.engine.failed() and not self.stopped:
            self.read_router(0)
            for event in self.receiver.poll(0.05 if self.engine.done() else 0):
                self.arrive(event)
            self.engine.step()
        self.report()

    def read_router(self, timeout_s: float) -> None:
        while not self.stopped and self.router.ready(timeout_s):
            message = self.router.receive(WAIT_SECONDS)
            self.stopped = message["type"] == "stop"
            self.expected[message.get("rid")] = message

    def arrive(self, event) -> None:
        if isinstance(event, Abort):
            self.engine.problems.append(f"request {event.seq_id}: the transfer aborted: {event.reason}")
            return
        if event.seq_id not in self.expected:  # the router's word on it may still be on its way
            self.read_router(WAIT_SECONDS)
        expected = self.expected.pop(event.seq_id)
        r = Request(event.seq_id, event.tokens[: len(expected["prompt"])], expected["target"])
        r.learn(event.tokens[len(expected["prompt"]):])  # the token sampled on the prefill engine
        r.computed, r.decoding = event.num_computed, True
        self.engine.running.append(r)
        self.arrived += 1

    def report(self) -> None:
        ok, report = self.engine.outcome(0.0)
        report = report.replace("engine_loop:", f"decode: arrived={self.arrived}", 1)
        self.expected.pop(None, None)  # the stop message
        self.router.send(dict(type="summary", ok=ok and not self.expected, report=report))


# --- the router ---------------------------------------------------------------------------
def start(role: str, args, port: int) -> subprocess.Popen:
    argv = [sys.executable, __file__, "--role", role, "--router-port", str(port), "--seed", str(args.seed),
            "--prefill-layout", args.prefill_layout, "--decode-layout", args.decode_layout,
            "--staging-kib", str(args.staging_kib), "--fault", args.fault, "--device", args.device]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def route(args) -> int:
    listener = socket.create_server(("127.0.0.1", 0))
    engines = [start(role, args, listener.getsockname()[1]) for role in ("decode", "prefill")]
    try:
        listener.settimeout(WAIT_SECONDS)
        channels = {}
        for _ in engines:
            channel = Channel(listener.accept()[0])
            hello = channel.receive(WAIT_SECONDS)
            channels[hello["role"]] = (channel, hello)
        return Router(args, channels).run()
    finally:
        for process in engines:
            try:
                process.wait(WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()


class Router:
    """Sends requests to prefill (and tells decode to expect them); a finished one may
    come back as a follow-up turn or a repeat."""

    def __init__(self, args, channels):
        self.prefill, hello = channels["prefill"]
        self.decode, decode_hello = channels["decode"]
        self.decode_address = decode_hello["address"]
        self.workload = Workload(random.Random(args.seed), args.requests, hello["max_len"])
        self.outstanding = 0
        self.finished = self.transferred = self.hit_tokens = 0
        self.summaries: Dict[Channel, dict] = {}

    def dispatch(self, r: Optional[Request]) -> None:
        if r is None:
            return
        message = dict(type="request", rid=r.rid, prompt=r.prompt, target=r.target, decode=self.decode_address)
        self.decode.send(message)
        self.prefill.send(message)
        self.outstanding += 1

    def run(self) -> int:
        for r in self.workload.first(max(1, self.workload.total * 2 // 3)):
            self.dispatch(r)
        deadline = time.monotonic() + RUN_SECONDS
        while self.outstanding and not self.summaries and time.monotonic() < deadline:
            ready, _, _ = select.select([self.prefill.sock, self.decode.sock], [], [], 1.0)
            for sock in ready:
                channel = self.prefill if sock is self.prefill.sock else self.decode
                self.handle(channel, channel.receive(WAIT_SECONDS))
        for channel in (self.prefill, self.decode):
            if channel not in self.summaries:
                channel.send(dict(type="stop"))
                self.summaries[channel] = channel.receive(WAIT_SECONDS)
        ok = not self.outstanding and all(s["ok"] for s in self.summaries.values())
        for s in self.summaries.values():
            print(s["report"])
        print(f"router: {'PASS' if ok else 'FAIL'} requests={self.finished} transferred={self.transferred} "
              f"decode_hit_tokens={self.hit_tokens} unfinished={self.outstanding}")
        return 0 if ok else 1

    def handle(self, channel: Channel, message: dict) -> None:
        if message["type"] == "sent":
            self.transferred += 1
            self.hit_tokens += message["cached"]
        elif message["type"] == "finished":
            self.outstanding -= 1
            self.finished += 1
            done = Request(message["rid"], message["tokens"][: message["prompt_len"]], 0)
            done.tokens = list(message["tokens"])
            self.dispatch(self.workload.after(done))
        elif message["type"] == "summary":  # an engine stopped early: it failed
            self.summaries[channel] = message


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    layouts = ("static", "upstream", "elastic", "row_space")
    p.add_argument("--prefill-layout", default="row_space", choices=layouts)
    p.add_argument("--decode-layout", default="elastic", choices=layouts)
    p.add_argument("--requests", type=int, default=24, help="requests served in all (follow-ups and repeats included)")
    p.add_argument("--staging-kib", type=int, default=0,
                   help="each engine's transfer staging buffer in KiB (0: rows go straight between the pools)")
    p.add_argument("--device", default="cpu",
                   help="both engines' device: cpu, or cuda on a GPU build (the KV then goes through the staging)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault", default="none", choices=("none", "no-bytes"),
                   help="no-bytes: the prefill engine's writes move nothing (the decode engine's check must fail)")
    p.add_argument("--role", default="router", choices=("router", "prefill", "decode"), help=argparse.SUPPRESS)
    p.add_argument("--router-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device != "cpu" and args.staging_kib <= 0:
        p.error(f"--device {args.device}: the KV goes through each engine's staging, so --staging-kib must be > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role == "router":
        return route(args)
    import torch
    torch.set_num_threads(1)  # as engine_loop.py: the step's tensors are small
    router = Channel.connect(("127.0.0.1", args.router_port), WAIT_SECONDS)
    (PrefillEngine if args.role == "prefill" else DecodeEngine)(args, router).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
