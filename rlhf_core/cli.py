"""What every ``rlhf`` subcommand shares: argparse parsers, and how errors are shown.

* Every subcommand's ``main(argv) -> int`` builds an ``argparse`` parser with ``prog="rlhf <name>"``, so
  ``--help`` works the same everywhere; the trainers take verl-style dotted overrides as positional arguments
  (:func:`overrides_parser`).
* :func:`run_command` runs a subcommand: ``--help`` exits 0; a bad command line exits 2 (argparse's usage
  line); an **input error** (:data:`INPUT_ERRORS`: a config, data or missing-file error, whose message names
  the key, file or row) prints one line ``rlhf <name>: error: <message>`` and exits 1; so does a full disk or a
  read-only store (:mod:`rlhf_core.storage`: an ``OSError`` with ``ENOSPC``, ``EDQUOT`` or ``EROFS``), naming the
  path and what was kept; either also when raised in a Ray worker (:func:`user_error` unwraps Ray's error, whose
  text is the remote traceback in colour); every such line is scrubbed of secrets
  (:func:`rlhf_core.redact.redact_text`); any other exception
  (``KeyError``, ``AttributeError``...: a bug, or a failing user function) propagates with its traceback;
  output into a pipe whose reader went away (``rlhf results sql ... | head``) ends quietly with 141.

Import-light on purpose (``rlhf config`` must start fast): no torch here.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import re
import select
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterator, NoReturn, Sequence

from omegaconf import DictConfig

from rlhf_core.config.errors import ConfigError
from rlhf_core.config.loader import CONFIG_NAMES, config_name_of, load_config
from rlhf_core.config.notices import ConfigNotice
from rlhf_core.data import DataError, RemoteUnavailableError
from rlhf_core.redact import install_log_redaction, redact_text
from rlhf_core.storage import storage_cause

INPUT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError, FileNotFoundError, RemoteUnavailableError)
"""Errors caused by the user's input: shown as one line, without a traceback."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

INTERRUPTED = 130
"""Exit code after Ctrl-C (SIGINT), as shells report a process killed by it (128 + 2)."""

BROKEN_PIPE = 141
"""Exit code when stdout's reader went away (``rlhf results sql ... | head``), as shells report SIGPIPE (128 + 13)."""

last_user_error: list[BaseException] = []
"""The input or storage error that :func:`run_command`'s last call in this process showed as one line and
returned 1 for (empty when it returned otherwise): lets ``rlhf_cli.tracked`` tell a run refused for its input
from one stopped by a full disk."""


def run_command(prog: str, command: Callable[[list[str]], int | None], argv: Sequence[str]) -> int:
    """``command(argv)``'s exit code, with the error display described in the module docstring; Ctrl-C prints
    ``<prog>: interrupted`` and returns :data:`INTERRUPTED`.

    Raises:
        every exception that is not an input error nor argparse's ``SystemExit`` (shown with a traceback).
    """
    last_user_error.clear()
    try:
        return int(command(list(argv)) or 0)
    except SystemExit as exc:  # argparse: --help (0), a usage error (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        return BROKEN_PIPE
    except KeyboardInterrupt:  # Ctrl-C before a command says more (config_command names the checkpoint)
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        cause = user_error(exc)  # an input error or a full disk, here or in a Ray worker: its one line
        if cause is None:
            raise
        text = str(cause) if cause is exc and isinstance(exc, INPUT_ERRORS) else one_line(cause)  # raised here
        print(f"{prog}: error: {redact_text(text)}", file=sys.stderr)
        last_user_error.append(cause)
        return 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (``poll`` reports ``POLLERR`` on it); if so, stdout is
    pointed at /dev/null so that the interpreter's own flush at exit does not print a second traceback."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real stdout (a test's capture), or no poll here
        return False
    if gone:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return gone


def user_error(exc: BaseException) -> BaseException | None:
    """The input error (:data:`INPUT_ERRORS`) or storage error (:func:`rlhf_core.storage.storage_cause`) that
    ``exc`` is or wraps, or None. Under Ray's ``RayTaskError`` (an error raised in a worker or a driver on Ray,
    whose ``str`` is the remote traceback in ANSI colours) the innermost such error is returned: its ``.cause``,
    followed through nested wrappers, at most 8 levels (storage errors also through ``__cause__``)."""
    found: BaseException | None = None
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, INPUT_ERRORS):
            found = seen
        seen = getattr(seen, "cause", None)
        if not isinstance(seen, BaseException):
            seen = None
    return found if found is not None else storage_cause(exc)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def one_line(exc: BaseException) -> str:
    """``str(exc)``'s first line without ANSI escape sequences (an input or storage error's message is one line;
    Ray appends the worker's traceback and colours its header)."""
    text = _ANSI.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def overrides_parser(prog: str, config_name: str, description: str, example: str) -> argparse.ArgumentParser:
    """A parser taking verl-style dotted overrides of ``rlhf_core/configs/<config_name>.yaml`` as positional arguments.

    ``example`` is one command line shown under the options; the epilog also says how to list every key."""
    epilog = (f"example:\n  {example}\n\nevery key and its default: rlhf config show --config-name {config_name}\n"
              f"validate without running:  rlhf config check --config-name {config_name} [overrides]")
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help=f"verl/Hydra overrides of {config_name}.yaml: a.b=v, +a.new=v, ++a.b=v, ~a.b")
    from rlhf_core.config.views import VIEWS

    views = [v for v, (of, _) in VIEWS.items() if of == config_name]
    parser.add_argument("--config-name", dest="config_name", default=config_name,
                        help=f"{config_name} (default; verl's names of it are accepted)"
                             + (f", {', '.join(views)} (the same keys with verl 0.9.1's defaults)" if views else "")
                             + " or a YAML file extending it")
    return parser


def _command_config(parsed: argparse.Namespace, config_name: str) -> str:
    """The config a trainer command loads: ``--config-name`` mapped from verl's spelling
    (:func:`~rlhf_core.config.loader.config_name_of`); ConfigError for a shipped config of another command."""
    from rlhf_core.config.views import VIEWS

    name = config_name_of(parsed.config_name)
    if name in CONFIG_NAMES and name != config_name or name in VIEWS and VIEWS[name][0] != config_name:
        raise ConfigError(f"--config-name {parsed.config_name}: this command runs {config_name}; "
                          f"{name} belongs to another command")
    return name


def setup_logging() -> None:
    """INFO logging to stderr with timestamps, for the long-running commands (ppo, sft, eval); secrets are
    scrubbed from every record (:func:`rlhf_core.redact.install_log_redaction`)."""
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def config_command(prog: str, config_name: str, description: str, example: str, run: Callable[[DictConfig], Any],
                   report: Callable[[Any], str], interrupted: Callable[[DictConfig], str] | None = None,
                   ) -> Callable[[Sequence[str] | None], int]:
    """The ``main(argv) -> int`` of a trainer-style command (``rlhf ppo|sft|eval``): parse the overrides, load
    ``config_name`` with them, ``result = run(config)``, print ``report(result)``; errors as in :func:`run_command`.
    ``argv`` ``None`` means ``sys.argv[1:]`` (the module run as ``python -m``).

    Ctrl-C (SIGINT) during ``run`` prints one line, ``<prog>: interrupted; <interrupted(config)>`` (e.g. the last
    checkpoint and how to resume), stops the embedded Ray instance ``run`` started
    (:func:`~rlhf_core.distributed.ray_init.stop_started_ray`) and returns :data:`INTERRUPTED` (130) — also when the
    interrupt surfaces as another exception (a Ray worker that got the same SIGINT from the terminal and died first).
    ``run`` should import what is heavy itself, so that ``--help``, a bad flag or a bad key answer before it is
    imported. ``main.check(argv)`` parses the command line and loads the config only (for a caller that checks them
    before importing more, e.g. the tracked runner): argparse's ``SystemExit`` or a ConfigError, as
    :func:`run_command` shows them."""
    def command(args: list[str]) -> int:
        parsed = overrides_parser(prog, config_name, description, example).parse_intermixed_args(args)
        setup_logging()
        config = load_config_with_notices(_command_config(parsed, config_name), parsed.overrides)
        with _sigint_seen() as seen:
            try:
                result = run(config)
            except BaseException as exc:
                if not (isinstance(exc, KeyboardInterrupt) or (seen and isinstance(exc, Exception))):
                    raise
                what = interrupted(config) if interrupted is not None else ""
                print(f"{prog}: interrupted" + (f"; {what}" if what else ""), file=sys.stderr, flush=True)
                _stop_started_ray()
                return INTERRUPTED
        print(report(result))
        return 0

    def main(argv: Sequence[str] | None = None) -> int:
        return run_command(prog, command, sys.argv[1:] if argv is None else argv)

    main.__doc__ = f"``{prog} key=value ...``: {description} Returns the exit code."
    def check(args: list[str]) -> None:
        parsed = overrides_parser(prog, config_name, description, example).parse_intermixed_args(args)
        with warnings.catch_warnings():  # the run that follows shows the notices
            warnings.simplefilter("ignore")
            load_config(_command_config(parsed, config_name), parsed.overrides)

    main.check = check  # type: ignore[attr-defined]
    return main


def load_config_with_notices(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """:func:`~rlhf_core.config.loader.load_config`, printing each key that will change nothing
    (:class:`~rlhf_core.config.notices.ConfigNotice`) as one ``Notice: ...`` line on stderr, as ``rlhf config check``
    does; other warnings are shown as usual. Raises what ``load_config`` raises (ConfigError)."""
    with warnings.catch_warnings(record=True) as caught:
        config = load_config(config_name, overrides)
    for w in caught:
        if issubclass(w.category, ConfigNotice):
            print(f"Notice: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return config


def _stop_started_ray() -> None:
    """After Ctrl-C: stop the embedded Ray that this process's run started, if any (Ray only when already imported)."""
    if "rlhf_core.distributed.ray_init" in sys.modules:
        sys.modules["rlhf_core.distributed.ray_init"].stop_started_ray()


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's finalization, for a command-line entry point after
    Ctrl-C: what a normal exit does first still happens (non-daemon threads are joined, the at-exit handlers run:
    Ray's, multiprocessing's, logging's), stdout and stderr are flushed, then ``os._exit``. The finalization skipped
    (module teardown, the native libraries' destructors) took about 2.3 s after an interrupted ``rlhf ppo`` on 2 busy
    cores and writes nothing of the run's: its checkpoints and metrics are complete before the interrupt line is
    printed.

    The threads are ended as the interpreter's own exit does (``threading._shutdown``: the exit hooks registered
    with ``threading._register_atexit`` first - a ``ThreadPoolExecutor``'s wakes its idle workers, which a plain
    join would wait for forever - then the joins), before the at-exit handlers, in the interpreter's order."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # an interpreter without it: join the non-daemon threads, each for at most 5 s
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(timeout=5.0)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def _sigint_seen() -> Iterator[list[float]]:
    """A list that gets one entry per SIGINT received inside the block; SIGINT still raises KeyboardInterrupt
    (Python's default handler). Outside the main thread, or where SIGINT is not handled by Python's default
    handler (ignored, or another handler), the list stays empty and the handler is unchanged."""
    seen: list[float] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield seen
        return

    def handler(signum: int, frame: Any) -> None:
        seen.append(time.monotonic())
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
