"""Read a verl launch script (bash) into its verl commands, without running it.

What a shell would do that matters for a verl command line, done here with the standard library's ``shlex``:
comments dropped (``#`` at the start of a word, outside quotes), ``\\`` line continuations joined (and a quote left
open continues on the next line), ``;``/``&&``/``||``/``|`` separating commands, quotes removed, and the variables
the script defines expanded in order (``X=...``, ``export X=...``; ``$X``, ``${X}``, ``${X:-default}``;
nothing inside single quotes). What a shell would take from outside the script is left as written and reported:
a variable the script does not define (``$HOME``), positional parameters (``$1``), command substitutions
(``$(pwd)``, backticks) and arithmetic. ``$@``/``$*`` (the script's extra arguments) are dropped. Control flow
(``if``, loops, functions) is not evaluated: every line is read once, top to bottom.

A verl command is any command holding ``-m verl.trainer.<module>`` (or a path ``.../verl/trainer/<module>.py``);
:data:`STAGES` says which module feeds which stage of an experiment. Pure parsing: no file is read but the script.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Iterator

from rlhf_core.config.errors import ConfigError

STAGES = {"main_ppo": "ppo", "fsdp_sft_trainer": "sft", "sft_trainer": "sft", "main_eval": "evaluation",
          "main_generation": "generation", "main_generation_server": "generation"}
"""verl.trainer module -> experiment stage (``generation`` becomes an evaluation suite)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!])(?:(:?[-=+?])(.*))?", re.S)
_SPECIAL = re.compile(r"[0-9@*#?$!]")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_SEPARATORS = {";", "&&", "||", "|", "&", ";;", "|&"}
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


@dataclass
class Command:
    """One verl command of the script. ``line``: 1-based line where it starts; ``stage``: a :data:`STAGES` value;
    ``launcher``: the words before ``-m`` (``torchrun --nproc_per_node=8``...); ``args``: the words after the
    module (``$@`` dropped); ``unexpanded``: each word's references left as written (word -> ["$HOME", ...])."""

    line: int
    module: str
    stage: str
    launcher: list[str]
    args: list[str]
    unexpanded: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Script:
    """A parsed script: its verl commands in order, the variables defined (name -> value), the defaults
    ``${X:-default}`` used (name -> default) and other commands that name verl but are not converted."""

    commands: list[Command]
    variables: dict[str, str]
    defaults_used: dict[str, str]
    skipped: list[str]


class _Expander:
    """Expands one logical line with the variables known so far; records what it leaves unexpanded."""

    def __init__(self, env: dict[str, str], refs: dict[str, list[str]], defaults: dict[str, str]):
        self.env, self.refs, self.defaults = env, refs, defaults
        self.missing: list[str] = []

    def line(self, text: str) -> tuple[str, str]:
        """(expanded text without its comment, state): state ``done``, ``continued`` (ends with ``\\``) or
        ``open`` (a quote is still open at the end)."""
        out: list[str] = []
        i, quote = 0, None
        while i < len(text):
            c = text[i]
            if quote == "'":
                quote = None if c == "'" else quote
                out.append(c)
                i += 1
            elif c == "\\":
                if i + 1 == len(text):
                    return "".join(out), "continued"
                out.append(text[i:i + 2])
                i += 2
            elif c in "'\"" and quote in (None, c):
                quote = None if quote == c else c
                out.append(c)
                i += 1
            elif c == "#" and quote is None and (i == 0 or text[i - 1] in " \t;&|("):
                break  # a comment runs to the end of the line
            elif c == "$":
                ref, i, value = self._reference(text, i)
                # left as written: quoted when unquoted, so that `$(( 2 * 3 ))` stays one word as in bash
                out.append((ref if quote else shlex.quote(ref)) if value is None else _requote(value, quote == '"'))
            elif c == "`":
                end = text.find("`", i + 1)
                end = len(text) - 1 if end < 0 else end
                self.missing.append(text[i:end + 1])
                out.append(text[i:end + 1] if quote else shlex.quote(text[i:end + 1]))
                i = end + 1
            else:
                out.append(c)
                i += 1
        return "".join(out), "open" if quote else "done"

    def _reference(self, text: str, i: int) -> tuple[str, int, str | None]:
        """(text of the reference at ``text[i] == '$'``, index after it, its value or None when unexpanded)."""
        nxt = text[i + 1:i + 2]
        if nxt in ("(", "{"):
            end = _matching(text, i + 1)
            ref = text[i:end]
            if nxt == "(":  # $(cmd), $((arith)): never run
                self.missing.append(ref)
                return ref, end, None
            m = _BRACED.fullmatch(ref[2:-1])
            if not m:  # ${#X}, ${X/a/b}, a Hydra ${a.b} interpolation: left as written
                return ref, end, None
            return ref, end, self._lookup(ref, m.group(1), m.group(2), m.group(3))
        m = _NAME.match(text, i + 1) or _SPECIAL.match(text, i + 1)
        if not m:
            return "$", i + 1, None
        return text[i:m.end()], m.end(), self._lookup(text[i:m.end()], m.group(0), None, None)

    def _lookup(self, ref: str, name: str, op: str | None, word: str | None) -> str | None:
        if name in ("@", "*"):
            return None  # the script's own arguments: dropped with their word later
        value = self.env.get(name)
        if value is not None and not (op == ":-" and value == "") and op not in ("+", ":+"):
            self.missing.extend(self.refs.get(name, []))
            return value
        if op in ("-", ":-", "=", ":="):
            sub = _Expander(self.env, self.refs, self.defaults)
            expanded, _ = sub.line(word or "")
            value = " ".join(shlex.split(expanded)) if expanded.strip() else ""
            self.missing.extend(sub.missing)
            self.defaults[name] = value
            if op.endswith("="):
                self.env[name], self.refs[name] = value, sub.missing
            return value
        self.missing.append(ref)
        return None


def _matching(text: str, i: int) -> int:
    """Index just after the bracket closing the one at ``text[i]`` (``(`` or ``{``), or ``len(text)``."""
    close = {"(": ")", "{": "}"}[text[i]]
    depth = 0
    for j in range(i, len(text)):
        depth += text[j] == text[i]
        depth -= text[j] == close
        if depth == 0:
            return j + 1
    return len(text)


def _requote(value: str, in_double_quotes: bool) -> str:
    """``value`` written back so that shlex reads what bash would: inside double quotes as is (``"`` and ``\\``
    escaped); unquoted, word-split on whitespace, each word quoted (bash does not re-read quotes in a value)."""
    if in_double_quotes:
        return value.replace("\\", "\\\\").replace('"', '\\"')
    return " ".join(shlex.quote(w) for w in value.split())


def _logical_lines(text: str, expander_for) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number, expanded text, references left unexpanded) per logical line (continuations joined);
    lazily, so that a line is expanded with the variables the lines before it defined."""
    buf, start = "", 0
    for number, physical in enumerate(text.splitlines(), 1):
        if not buf:
            start = number
        buf += physical
        expander = expander_for()
        expanded, state = expander.line(buf)
        if state == "continued":
            buf = buf[:-1]  # bash removes the backslash and the newline
        elif state == "open":
            buf += "\n"
        else:
            yield start, expanded, expander.missing
            buf = ""
    if buf:
        raise ConfigError(f"line {start}: a quote opened here is never closed")


def _words(text: str, where: str) -> list[list[str]]:
    """The commands of one logical line: shlex words split at ``;``, ``&&``, ``||``, ``|``, ``&``."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split the command line ({exc})") from exc
    commands, current = [], []
    for w in words:
        if w in _SEPARATORS:
            commands.append(current)
            current = []
        elif not re.fullmatch(r"[0-9]*[<>]+&?[0-9-]*", w):  # redirections (2>, >>) are not arguments
            current.append(w)
    return [c for c in commands + [current] if c]


def _verl_module(words: list[str]) -> tuple[int, str] | None:
    """(index of the module word, module name) for ``-m verl.trainer.X`` or ``.../verl/trainer/X.py``."""
    for i, w in enumerate(words):
        m = re.fullmatch(r"verl\.trainer\.(\w+)", w) if i and words[i - 1] == "-m" else \
            re.fullmatch(r"(?:.*/)?verl/trainer/(\w+)\.py", w)
        if m:
            return i, m.group(1)
    return None


def read_script(text: str, source: str) -> Script:
    """Parse the text of a bash launch script (``source`` names it in errors) into its verl commands.

    Raises:
        ConfigError: a quote never closed, or a line shlex cannot split, naming ``source`` and the line.
    """
    env: dict[str, str] = {}
    refs: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}
    commands, skipped = [], []
    try:
        for number, expanded, missing in _logical_lines(text, lambda: _Expander(env, refs, defaults)):
            for words in _words(expanded, f"{source}, line {number}"):
                _read_command(words, number, missing, env, refs, commands, skipped)
    except ConfigError as exc:
        raise ConfigError(exc.args[0] if str(exc).startswith(source) else f"{source}: {exc}") from None
    return Script(commands, dict(env), defaults, skipped)


def _read_command(words: list[str], number: int, missing: list[str], env: dict[str, str],
                  refs: dict[str, list[str]], commands: list[Command], skipped: list[str]) -> None:
    """Record one command: an assignment updates ``env``; a verl command is appended to ``commands``."""
    assigns = words[1:] if words[0] in _DECLARE else words
    if assigns and all(_ASSIGN.fullmatch(w) for w in assigns):
        for w in assigns:
            name, value = _ASSIGN.fullmatch(w).groups()
            env[name], refs[name] = value, [r for r in missing if r in value]
        return
    if words[0] == "unset":
        for name in words[1:]:
            env.pop(name, None)
        return
    found = _verl_module(words)
    if found is None:
        if any("verl" in w for w in words):
            skipped.append(f"line {number}: {' '.join(words)[:120]}")
        return
    index, module = found
    if module not in STAGES:
        skipped.append(f"line {number}: verl.trainer.{module} (no stage of an experiment runs it)")
        return
    args = [w for w in words[index + 1:] if w not in ("$@", "$*")]
    unexpanded = {w: [r for r in dict.fromkeys(missing) if r in w] for w in words}
    commands.append(Command(number, module, STAGES[module], words[:index], args,
                            {w: r for w, r in unexpanded.items() if r}))


__all__ = ["Command", "STAGES", "Script", "read_script"]
