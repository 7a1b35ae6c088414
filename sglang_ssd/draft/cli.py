"""``python -m sglang_ssd.draft_server``: load a draft model and serve it over ZeroMQ.

Prints one line ``READY <endpoint>`` on stdout once it serves; SIGTERM / SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ..cpu.allocator import keep_freed_memory
from ..wire.codec import Limits
from ..wire.settings import DraftSettings, add_setting_flags, settings_from_flags
from ..wire.spawn import READY
from ..wire.transport import ZmqServerTransport, is_loopback
from .engine import DraftEngine, EngineConfig
from .l0 import L0Level
from .model import DraftModel
from .server import DraftServer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang_ssd.draft_server", description=__doc__)
    p.add_argument("--model", required=True, help="draft model folder (config.json + safetensors)")
    p.add_argument("--bind", default="ipc:///tmp/sglang-ssd-draft.sock", help="ipc://PATH or tcp://HOST:PORT")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES])
    p.add_argument("--attention", default="auto", choices=["auto", "torch", "c", "flashinfer", "triton"])
    p.add_argument("--fanout-list", default=None, help="fixed fan-out F_0..F_K, comma separated")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--kv-slots", type=int, default=0, help="KV pool size in tokens (0: from --kv-mem-mb)")
    p.add_argument("--kv-mem-mb", type=float, default=1024.0, help="KV pool memory when --kv-slots is 0")
    p.add_argument("--max-requests", type=int, default=1024)
    p.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle request is freed")
    p.add_argument("--max-step-tokens", type=int, default=4096, help="cap on tokens per tree forward")
    p.add_argument("--no-step-deadline", action="store_true",
                   help="start every tree step at once, even one that would still run when the next round is due")
    p.add_argument("--max-open-tokens", type=int, default=4096,
                   help="prompt tokens one open message may make the server prefill (the rest are refused, per request)")
    p.add_argument("--inline-prefill-tokens", type=int, default=64,
                   help="prompt tokens an open message prefills before its reply; longer prompts are prefilled "
                        "in the background, one --prefill-chunk per work step (async mode)")
    p.add_argument("--prefill-chunk", type=int, default=512, help="prompt tokens per prefill forward")
    p.add_argument("--max-message-mb", type=float, default=512.0, help="largest accepted message")
    p.add_argument("--curve-secret-file", default=None, help="file with the server's Z85 CURVE secret key")
    p.add_argument("--l0", default=None, help="recursive chain: n-gram L0 file (models/ngram.json) drafting for --model")
    g = p.add_argument_group("draft settings", "all at once as JSON (--settings, what the launcher passes), "
                             "or one flag each; a flag given overrides the same field of --settings")  # fmt: skip
    g.add_argument("--settings", default=None, help="a DraftSettings JSON object (sglang_ssd/wire/settings.py)")
    add_setting_flags(g, "--", defaults=False)  # --k, --budget, ...: one per DraftSettings field
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def draft_settings(args: argparse.Namespace) -> DraftSettings:
    base = DraftSettings.from_json(args.settings) if args.settings else DraftSettings()
    return replace(base, **settings_from_flags(args)).validate()


def build_server(args: argparse.Namespace) -> DraftServer:
    settings = draft_settings(args)  # before the model loads: a bad value fails at once
    dtype = None if args.dtype == "auto" else _DTYPES[args.dtype]
    model = DraftModel(args.model, device=args.device, dtype=dtype, kv_slots=args.kv_slots, attention=args.attention,
                       kv_mem_mb=args.kv_mem_mb)  # fmt: skip
    fanout_list = [int(x) for x in args.fanout_list.split(",")] if args.fanout_list else None
    l0 = L0Level.load(args.l0, settings.l0_tokens, settings.l0_temperature) if args.l0 else None
    cfg = EngineConfig(
        **vars(settings),
        fanout_list=fanout_list,
        max_requests=args.max_requests,
        idle_timeout_s=args.idle_timeout,
        max_step_tokens=args.max_step_tokens,
        step_deadline=not args.no_step_deadline,
        max_open_tokens=args.max_open_tokens,
        inline_prefill_tokens=args.inline_prefill_tokens,
        prefill_chunk=args.prefill_chunk,
    )
    max_bytes = int(args.max_message_mb * (1 << 20))
    limits = Limits(max_header_bytes=min(16 << 20, max_bytes), max_tensor_bytes=max_bytes, max_message_bytes=max_bytes)
    return DraftServer(DraftEngine(model, cfg, l0=l0), limits)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    secret = Path(args.curve_secret_file).read_bytes().strip() if args.curve_secret_file else None
    if not is_loopback(args.bind) and secret is None:
        logging.warning("serving %s beyond loopback without CURVE: anyone who can reach it can use it", args.bind)
    try:
        if args.device == "cpu":  # a step's freed buffers stay in the process, as on the target side
            keep_freed_memory()
        server = build_server(args)
    except (ValueError, OSError) as e:  # bad model folder, L0 file, flag value: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    transport = ZmqServerTransport(args.bind, curve_secret_key=secret, max_frame_bytes=2 * server.limits.max_message_bytes)
    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{READY} {transport.endpoint}", flush=True)
    try:
        server.serve(transport, lambda: stop["flag"])
    finally:
        transport.close()
        if args.bind.startswith("ipc://"):
            Path(args.bind[len("ipc://") :]).unlink(missing_ok=True)
    return 0
