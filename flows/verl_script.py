"""Read a verl launch script (bash) into its verl commands, without running it.

What a shell would do that matters for a verl command line, done here with the standard library's ``shlex``:
comments dropped (``#`` at the start of a word, outside quotes), ``\\`` line continuations joined (and a quote left
open continues on the next line), ``;``/``&&``/``||``/``|`` separating commands, quotes removed, and the variables
the script defines expanded in order (``X=...``, ``export X=...``; ``$X``, ``${X}``, ``${X:-default}``;
nothing inside single quotes), bash arrays (``ARGS=( a "b c" )`` over several lines, ``ARGS+=(...)``,
``"${ARGS[@]}"`` as one word per element, ``${ARGS[0]}``: verl 0.9's examples group their overrides so) and integer
arithmetic over numbers and defined variables (``$((1024 * 2))``, ``$((a + b))``). What a shell would take from
outside the script is left as written and reported: a variable the script does not define (``$HOME``), positional
parameters (``$1``), command substitutions (``$(pwd)``, backticks) and arithmetic it cannot evaluate. ``$@``/``$*``
(the script's extra arguments) are dropped. ``if``/``case`` branches are followed where their tests are known
(:mod:`flows.verl_script_flow`; undecided ones are all read); loops and functions are not evaluated.

A verl command is any command holding ``-m verl.trainer.<module>`` (or a path ``.../verl/trainer/<module>.py``), or
one of the other entry points in :data:`OTHER_MODULES` (verl 0.9's off-policy trainers, the DAPO recipe);
:data:`STAGES` says which module feeds which stage of an experiment. Pure parsing: no file is read but the script.
"""
from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterator

from flows.verl_script_flow import Flow
from rlhf_core.config.errors import ConfigError

STAGES = {"main_ppo": "ppo", "fsdp_sft_trainer": "sft", "sft_trainer": "sft", "main_eval": "evaluation",
          "main_generation": "generation", "main_generation_server": "generation"}
"""verl.trainer module -> experiment stage (``generation`` becomes an evaluation suite)."""

OTHER_MODULES = {
    "verl.experimental.one_step_off_policy.main_ppo": ("main_ppo", ["async_training.mode=one_step_off_policy"]),
    "verl.experimental.fully_async_policy.fully_async_main": ("main_ppo", ["async_training.mode=fully_async"]),
    "recipe.dapo.main_dapo": ("main_ppo", []),
}
"""Entry points outside ``verl.trainer`` -> (the :data:`STAGES` module whose config they extend, the overrides that
choose the same trainer here, put before the command's own). verl 0.9's one-step off-policy and fully asynchronous
trainers take ``ppo_trainer``'s keys plus their own and are ``async_training.mode`` here; the DAPO recipe's
``main_dapo`` runs ``ppo_trainer`` with ``algorithm.filter_groups``, which verl 0.9's ``main_ppo`` has too)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!])(?:(:?[-=+?])(.*))?", re.S)
_SPECIAL = re.compile(r"[0-9@*#?$!]")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_ARRAY_REF = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*]|[0-9]+)\]")
_ARRAY_START = re.compile(r"\s*(?:(?:export|local|declare|readonly|typeset)(?:\s+-[A-Za-z]+)*\s+)?"
                          r"[A-Za-z_][A-Za-z0-9_]*\+?=\(")
_ARRAY_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)", re.S)
_ASSIGNING = re.compile(r"(?:^|[\s;&|])(?:export\s+|local\s+|readonly\s+)?[A-Za-z_][A-Za-z0-9_]*=[^\s(]*$")
_ARITH = re.compile(r"[0-9A-Za-z_$+\-*/%() \t]*")
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
    ``${X:-default}`` used (name -> default), other commands that name verl but are not converted, and the
    ``if``/``case`` tests that could not be decided (every branch read)."""

    commands: list[Command]
    variables: dict[str, str]
    defaults_used: dict[str, str]
    skipped: list[str]
    branches: list[str] = field(default_factory=list)
    assignments: list[str] = field(default_factory=list)  # whose value won: undecided branches, --set over a line


class _Assignments:
    """Which assignment of a variable wins, said in notes. ``preset`` (``--set NAME=VALUE``) wins over the script's
    own ``NAME=...`` (as a user expects of ``--set``; bash would take the script's line), each overridden line named;
    an assignment read inside an undecided ``if``/``case`` branch (every branch is read, the last read wins) is named
    with its branch when nothing decided assigns the name after it."""

    def __init__(self, preset: dict[str, str], flow: Flow):
        self.preset, self.flow = preset, flow
        self.overridden: dict[str, list[tuple[int, str]]] = {}
        self.undecided: dict[str, list[tuple[int, str, str]]] = {}

    def allow(self, name: str, value: str, number: int) -> bool:
        """Whether the script's ``name=value`` at line ``number`` is applied (False: ``--set`` holds the name)."""
        if name in self.preset:
            if value != self.preset[name]:
                self.overridden.setdefault(name, []).append((number, value))
            return False
        branch = self.flow.undecided_branch()
        if branch is None:
            self.undecided.pop(name, None)
        else:
            self.undecided.setdefault(name, []).append((number, branch, value))
        return True

    def notes(self) -> list[str]:
        out = [f"--set {name}={self.preset[name]!r} overrides the script's {name}={value!r} (line {number})"
               for name, lines in self.overridden.items() for number, value in lines]
        for name, seen in self.undecided.items():
            number, branch, value = seen[-1]
            others = ", ".join(f"line {n} in {b}" for n, b, _ in seen[:-1])
            out.append(f"{name}={value!r} from line {number} in the undecided branch {branch} is the value used (the "
                       f"last assignment read{'; also assigned at ' + others if others else ''}); choose the branch "
                       "with --set")
        return out


class _Expander:
    """Expands one logical line with the variables known so far; records what it leaves unexpanded."""

    def __init__(self, env: dict[str, str], refs: dict[str, list[str]], defaults: dict[str, str],
                 arrays: dict[str, list[str]]):
        self.env, self.refs, self.defaults, self.arrays = env, refs, defaults, arrays
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
            elif c == "#" and quote is None and (i == 0 or text[i - 1] in " \t\n;&|("):
                end = text.find("\n", i)  # a comment runs to the end of the (physical) line
                if end < 0:
                    break
                i = end
            elif c == "$":
                held = len(self.missing)
                ref, i, value = self._reference(text, i)
                # a value holding a command substitution left unrun stands for that command's (one-word) output
                keep = isinstance(value, str) and any(r in value for r in self.missing[held:])
                if isinstance(value, list):  # "${A[@]}": one word per element; unquoted, each element word-split
                    out.append('" "'.join(_requote(v, True) for v in value) if quote == '"' else
                               " ".join(_requote(v, False) for v in value))
                elif value is not None and quote is None and (keep or _ASSIGNING.search("".join(out))):
                    out.append(shlex.quote(value))  # X=$Y: an assignment's value is not word-split
                else:  # left as written: quoted when unquoted, so that `$(cmd arg)` stays one word as in bash
                    out.append((ref if quote else shlex.quote(ref)) if value is None else
                               _requote(value, quote == '"'))
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

    def _reference(self, text: str, i: int) -> tuple[str, int, str | list[str] | None]:
        """(text of the reference at ``text[i] == '$'``, index after it, its value, a list of words for
        ``${A[@]}``, or None when unexpanded)."""
        nxt = text[i + 1:i + 2]
        if nxt in ("(", "{"):
            end = _matching(text, i + 1)
            ref = text[i:end]
            if nxt == "(":  # $(cmd): never run; $((arith)): evaluated when it is integer arithmetic we can read
                value = self._arithmetic(ref[3:-2]) if ref.startswith("$((") and ref.endswith("))") else None
                if value is None:
                    self.missing.append(ref)
                return ref, end, value
            array = _ARRAY_REF.fullmatch(ref[2:-1])
            if array and array.group(1) in self.arrays:
                items = self.arrays[array.group(1)]
                self.missing.extend(self.refs.get(array.group(1), []))
                if array.group(2) in "@*":
                    return ref, end, list(items)
                index = int(array.group(2))
                return ref, end, items[index] if index < len(items) else ""
            m = _BRACED.fullmatch(ref[2:-1])
            if not m:  # ${#X}, ${X/a/b}, a Hydra ${a.b} interpolation: left as written
                return ref, end, None
            return ref, end, self._lookup(ref, m.group(1), m.group(2), m.group(3))
        m = _NAME.match(text, i + 1) or _SPECIAL.match(text, i + 1)
        if not m:
            return "$", i + 1, None
        return text[i:m.end()], m.end(), self._lookup(text[i:m.end()], m.group(0), None, None)

    def _arithmetic(self, expr: str) -> str | None:
        """``expr`` of ``$((expr))`` evaluated as bash does for integers (``/`` truncates toward zero), with the
        variables defined so far; None when it holds anything else (or an undefined variable, or divides by 0)."""
        if not _ARITH.fullmatch(expr):
            return None
        names = {n: self.env.get(n) for n in _NAME.findall(expr) if not n[0].isdigit()}
        if any(v is None or not re.fullmatch(r"-?[0-9]+", v.strip()) for v in names.values()):
            return None
        try:
            tree = ast.parse(expr.replace("$", "").strip(), mode="eval")
            return str(_integer_eval(tree.body, {n: int(v) for n, v in names.items()}))
        except (SyntaxError, ValueError, ZeroDivisionError):
            return None

    def _lookup(self, ref: str, name: str, op: str | None, word: str | None) -> str | None:
        if name in ("@", "*"):
            return None  # the script's own arguments: dropped with their word later
        value = self.env.get(name)
        if value is not None and not (op == ":-" and value == "") and op not in ("+", ":+"):
            self.missing.extend(self.refs.get(name, []))
            return value
        if op in ("-", ":-", "=", ":="):
            sub = _Expander(self.env, self.refs, self.defaults, self.arrays)
            expanded, _ = sub.line(word or "")
            value = " ".join(shlex.split(expanded)) if expanded.strip() else ""
            self.missing.extend(sub.missing)
            self.defaults[name] = value
            if op.endswith("="):
                self.env[name], self.refs[name] = value, sub.missing
            return value
        self.missing.append(ref)
        return None


def _integer_eval(node: ast.AST, names: dict[str, int]) -> int:
    """An integer arithmetic expression tree (numbers, names, unary -/+, + - * / %) evaluated as bash does."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _integer_eval(node.operand, names)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        a, b = _integer_eval(node.left, names), _integer_eval(node.right, names)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # C's division, as bash
            return quotient if not isinstance(node.op, ast.Mod) else a - b * quotient
    raise ValueError("not integer arithmetic")


def _open_array(text: str) -> bool:
    """Whether ``text`` starts an array assignment (``A=(``) whose closing ``)`` has not come yet (quotes and
    comments skipped)."""
    m = _ARRAY_START.match(text)
    if not m:
        return False
    depth, quote, i = 1, None, m.end()
    while i < len(text):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
            i += 2 if c == "\\" and quote == '"' else 1
            continue
        if c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and text[i - 1] in " \t\n(":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        else:
            depth += (c == "(") - (c == ")")
        i += 1
    return depth > 0


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
        if state == "done" and _open_array(buf):
            state = "open"  # an array's elements may run over several lines
        if state == "continued":
            buf = buf[:-1]  # bash removes the backslash and the newline
        elif state == "open":
            buf += "\n"
        else:
            yield start, expanded, expander.missing
            buf = ""
    if buf:
        raise ConfigError(f"line {start}: a quote opened here is never closed")


def _tokens(text: str, where: str) -> list[str]:
    """The shlex words of one logical line, with the separators ``;``, ``&&``, ``||``, ``|``, ``&``, ``;;`` as
    tokens of their own and redirections (``2>``, ``>>``) dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split the command line ({exc})") from exc
    return [w for w in words if not re.fullmatch(r"[0-9]*[<>]+&?[0-9-]*", w)]


def _verl_module(words: list[str]) -> tuple[int, str] | None:
    """(index of the module word, module name) for ``-m verl.trainer.X`` or ``.../verl/trainer/X.py`` (``X``), or
    ``-m`` one of :data:`OTHER_MODULES` (its full dotted name)."""
    for i, w in enumerate(words):
        if i and words[i - 1] == "-m" and w in OTHER_MODULES:
            return i, w
        m = re.fullmatch(r"verl\.trainer\.(\w+)", w) if i and words[i - 1] == "-m" else \
            re.fullmatch(r"(?:.*/)?verl/trainer/(\w+)\.py", w)
        if m:
            return i, m.group(1)
    return None


def read_script(text: str, source: str, preset: dict[str, str] | None = None) -> Script:
    """Parse the text of a bash launch script (``source`` names it in errors) into its verl commands.

    ``preset``: variables set before the script runs, as a caller's environment would (``DEVICE=gpu bash run.sh``):
    the script's ``${DEVICE:-...}`` takes them, and the ``if``/``case`` branches they decide are followed
    (:mod:`flows.verl_script_flow`).

    Raises:
        ConfigError: a quote never closed, or a line shlex cannot split, naming ``source`` and the line.
    """
    env: dict[str, str] = dict(preset or {})
    refs: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    commands, skipped = [], []
    flow = Flow()
    assignments = _Assignments(dict(preset or {}), flow)
    try:
        for number, expanded, missing in _logical_lines(text, lambda: _Expander(env, refs, defaults, arrays)):
            for words in flow.feed(_tokens(expanded, f"{source}, line {number}"), number, _SEPARATORS):
                _read_command(words, number, missing, env, refs, arrays, commands, skipped, assignments)
    except ConfigError as exc:
        raise ConfigError(exc.args[0] if str(exc).startswith(source) else f"{source}: {exc}") from None
    return Script(commands, dict(env), defaults, skipped, flow.notes, assignments.notes())


def _read_command(words: list[str], number: int, missing: list[str], env: dict[str, str],
                  refs: dict[str, list[str]], arrays: dict[str, list[str]], commands: list[Command],
                  skipped: list[str], assignments: _Assignments) -> None:
    """Record one command: an assignment updates ``env`` (an array assignment ``arrays``); a verl command is
    appended to ``commands``."""
    assigns = words[1:] if words[0] in _DECLARE else words
    while assigns and assigns[0].startswith("-"):  # declare -a / local -x ...
        assigns = assigns[1:]
    array = _ARRAY_ASSIGN.fullmatch(assigns[0]) if assigns else None
    if array:
        name, append, first = array.groups()
        items = ([first] if first else []) + assigns[1:]
        if items and items[-1].endswith(")"):
            items[-1] = items[-1][:-1]
            items = items if items[-1] else items[:-1]
        arrays[name] = (arrays.get(name, []) if append else []) + items
        held = [r for r in missing if any(r in item for item in items)]
        env[name] = arrays[name][0] if arrays[name] else ""
        refs[name] = list(dict.fromkeys((refs.get(name, []) if append else []) + held))
        return
    if assigns and all(_ASSIGN.fullmatch(w) for w in assigns):
        for w in assigns:
            name, value = _ASSIGN.fullmatch(w).groups()
            if assignments.allow(name, value, number):
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
    base, implied = OTHER_MODULES.get(module, (module, []))
    if base not in STAGES:
        skipped.append(f"line {number}: verl.trainer.{module} (no stage of an experiment runs it)")
        return
    args = implied + [w for w in words[index + 1:] if w not in ("$@", "$*", "")]  # "" : an empty "${A[@]}"
    unexpanded = {w: [r for r in dict.fromkeys(missing) if r in w] for w in words}
    commands.append(Command(number, module, STAGES[base], words[:index], args,
                            {w: r for w, r in unexpanded.items() if r}))


__all__ = ["Command", "OTHER_MODULES", "STAGES", "Script", "read_script"]
