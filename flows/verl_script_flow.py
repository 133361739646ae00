"""``if``/``elif``/``else``/``fi`` and ``case``/``esac`` in a verl launch script, decided where their words are known.

verl 0.9's examples choose overrides by device and backend (``case "${DEVICE}" in gpu) ... ;; npu) ... ;; esac``,
``if [ "${INFER_BACKEND}" = sglang ]; then EXTRA+=(...); fi``). Reading every branch would mix a GPU run's settings
with an NPU run's, so :class:`Flow` follows the branches as bash would when the tested words are known (defined by
the script, or set by the user: ``rlhf experiment from-verl run.sh --set DEVICE=gpu``): a branch not taken is not
read (its assignments and commands are skipped). A test it cannot decide (a word the script leaves unexpanded, such as
``$#`` or ``$(python3 -c ...)``, a file test, a command as condition) reads every branch, as before, and says so in
:attr:`Flow.notes`. Loops and functions are not evaluated.

A test guarding one command (``[ "$X" = 1 ] && ARGS+=(...)``, ``|| ...``) is decided the same way. Supported tests:
``[ ... ]``, ``[[ ... ]]`` and ``test ...`` with ``=``, ``==``, ``!=``, ``-z``, ``-n``, ``-eq``,
``-ne``, ``-lt``, ``-le``, ``-gt``, ``-ge``, ``!`` and a single word; tests joined by ``&&``/``||`` (left to right, as
bash), ``{ ...; }`` and ``( ... )`` groups of them. ``case`` patterns are glob patterns (``gpu | npu)``, ``*)``);
the first clause that matches is taken.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

_INT_TESTS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
              "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}


@dataclass
class _Frame:
    kind: str                 # "if" or "case"
    line: int                 # where it starts, for notes
    active: bool | None       # the branch being read: taken, not taken, or undecided (read)
    taken: bool = False       # a branch of this frame was known to be taken: the later ones are not
    undecided: bool = False   # an earlier branch was undecided: a later "else" is undecided too
    value: str | None = None  # a case's word (None: unknown)
    in_clause: bool = False   # a case is inside a clause (after "pattern)", before ";;")
    label: str = ""           # the branch being read, for notes: "`elif [ ... ]` (line 7)"


def _known(word: str) -> bool:
    return "$" not in word and "`" not in word


def _test(words: list[str]) -> bool | None:
    """One ``[ ... ]`` / ``test ...`` expression (without its brackets): True, False, or None when undecided."""
    if words[:1] == ["!"]:
        inner = _test(words[1:])
        return None if inner is None else not inner
    if not all(_known(w) for w in words):
        return None
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3 and words[1] in ("=", "==", "!="):
        matches = words[0] == words[2] if words[1] == "=" else fnmatch.fnmatchcase(words[0], words[2])
        return matches if words[1] != "!=" else words[0] != words[2]
    if len(words) == 3 and words[1] in _INT_TESTS:
        try:
            return _INT_TESTS[words[1]](int(words[0]), int(words[2]))
        except ValueError:
            return None
    return None  # file tests (-f, -d), regex (=~), anything else


_GROUPS = {"{": "}", "(": ")"}


def condition(tokens: list[str]) -> bool | None:
    """The value of an ``if``/``elif`` condition (its tokens between ``if`` and ``then``, separators included).
    A ``{ ...; }`` or ``( ... )`` group is one operand, decided inside first, as bash does: verl 0.9's
    ``[ "$VERL_USE_UV" != 0 ] && [ "$DEVICE" = gpu ] && { [ "$B" = vllm ] || [ "$B" = sglang ]; }`` is false with
    ``VERL_USE_UV=0`` (cut at the ``||`` inside the braces too, it was read as undecided)."""
    result: bool | None = None
    op = None
    for part, sep in _split(tokens, ("&&", "||")):
        value = _group(part)
        if op is None:
            result = value
        elif op == "&&":
            result = False if (result is False or value is False) else (None if None in (result, value) else True)
        else:
            result = True if (result is True or value is True) else (None if None in (result, value) else False)
        op = sep
    return result


def _group(words: list[str]) -> bool | None:
    """One operand of a condition: ``! X``, a ``{ ...; }`` / ``( ... )`` group (its inside decided by
    :func:`condition`), or a test (:func:`_one`)."""
    if words[:1] == ["!"]:
        inner = _group(words[1:])
        return None if inner is None else not inner
    if len(words) >= 2 and _GROUPS.get(words[0]) == words[-1]:
        return condition([w for w in words[1:-1] if w != ";"])
    return _one(words)


def _one(words: list[str]) -> bool | None:
    if words[:1] == ["!"]:
        inner = _one(words[1:])
        return None if inner is None else not inner
    if len(words) >= 2 and (words[0], words[-1]) in (("[", "]"), ("[[", "]]")):
        return _test(words[1:-1])
    if words[:1] == ["test"]:
        return _test(words[1:])
    return None  # a command as condition: never run


def _split(tokens: list[str], seps: tuple[str, ...]) -> list[tuple[list[str], str | None]]:
    """``tokens`` cut at each separator in ``seps`` outside ``{ }`` / ``( )`` groups: (part, the separator after it)."""
    parts, current, depth = [], [], 0
    for t in tokens:
        depth += (t in _GROUPS) - (t in _GROUPS.values())
        if t in seps and depth == 0:
            parts.append((current, t))
            current = []
        else:
            current.append(t)
    return parts + [(current, None)]


def _guarded(guard: tuple[str, bool | None] | None) -> bool:
    """Whether the command after ``[ test ] &&`` (runs when the test is true) or ``||`` (when false) runs; an
    undecided test (None) reads it."""
    if guard is None or guard[1] is None:
        return True
    return guard[1] if guard[0] == "&&" else not guard[1]


class Flow:
    """The branches being read while a script is read top to bottom (see the module docstring).

    :meth:`feed` takes one logical line's tokens (words and the separators ``;``, ``&&``, ``||``, ``|``, ``;;``)
    and returns the simple commands (lists of words) that bash would run there; control words are consumed.
    """

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.notes: list[str] = []

    def reading(self) -> bool:
        """Whether the current branch is read (taken, or undecided)."""
        return all(f.active is not False for f in self.stack)

    def undecided_branch(self) -> str | None:
        """The innermost undecided branch being read (``"`else` (line 9)"``), or None when every enclosing branch
        was decided: an assignment read there may be overwritten by a sibling branch's (the last read wins)."""
        return next((f.label for f in reversed(self.stack) if f.active is None), None)

    def feed(self, tokens: list[str], line: int, separators: set[str]) -> list[list[str]]:
        commands: list[list[str]] = []
        cmd: list[str] = []
        guard: tuple[str, bool | None] | None = None  # `[ test ] && cmd` / `|| cmd`: the test's value for cmd
        i = 0
        while i < len(tokens):
            t = tokens[i]
            if t in separators:
                if cmd and t in ("&&", "||") and cmd[0] in ("[", "[[", "test", "!"):
                    guard = (t, _one(cmd))  # a test guarding the next command, not a command
                    if guard[1] is None and self.reading():
                        self.notes.append(f"line {line}: `{' '.join(cmd)} {t} ...` cannot be decided here (a value "
                                          f"the script leaves to its caller; set it with --set NAME=VALUE): the "
                                          f"command after it is read")
                elif cmd and self.reading() and _guarded(guard):
                    commands.append(cmd)
                    guard = None
                else:
                    guard = None
                cmd = []
                if t == ";;" and self.stack and self.stack[-1].kind == "case":
                    self.stack[-1].in_clause = False
                i += 1
                continue
            top = self.stack[-1] if self.stack else None
            if not cmd and top and top.kind == "case" and not top.in_clause and t != "esac":
                i = self._clause(tokens, i, top, line)
                continue
            if not cmd and t in ("if", "elif"):
                end = next((j for j in range(i + 1, len(tokens)) if tokens[j] == "then" and tokens[j - 1] == ";"),
                           len(tokens))
                cond = [w for w in tokens[i + 1:end] if w != ";"]
                self._branch(t, condition(cond), line, " ".join(tokens[i:end]).rstrip(" ;"))
                i = end + 1
                continue
            if not cmd and t in ("then", "do", "done"):
                i += 1
                continue
            if not cmd and t == "else":
                self._branch("else", True, line, "else")
                i += 1
                continue
            if not cmd and t in ("fi", "esac"):
                if self.stack:
                    self.stack.pop()
                i += 1
                continue
            if not cmd and t == "case" and i + 2 < len(tokens) and tokens[i + 2] == "in":
                word = tokens[i + 1]
                parent = self.reading()
                frame = _Frame("case", line, None if parent else False, value=word if _known(word) else None)
                if frame.value is None and parent:
                    self.notes.append(f"line {line}: case {word} ...: {word} is not known here (set it with "
                                      f"--set NAME=VALUE); every branch read")
                self.stack.append(frame)
                i += 3
                continue
            cmd.append(t)
            i += 1
        if cmd and self.reading() and _guarded(guard):
            commands.append(cmd)
        return commands

    def _clause(self, tokens: list[str], i: int, top: _Frame, line: int) -> int:
        """Read ``pat1 | pat2)`` at ``tokens[i]``; set whether that clause is read; the index after it."""
        patterns: list[str] = []
        while i < len(tokens):
            w = tokens[i]
            i += 1
            if w == "|":
                continue
            patterns.append(w[:-1] if w.endswith(")") else w)
            if w.endswith(")"):
                break
        patterns = [re.sub(r"^\(", "", p) for p in patterns if p]
        top.in_clause = True
        top.label = f"`case {top.value if top.value is not None else '?'} in {' | '.join(patterns)})` (line {line})"
        parent = all(f.active is not False for f in self.stack[:-1])
        if not parent or top.taken:
            top.active = False
        elif top.value is None:
            top.active = None
        else:
            top.active = any(fnmatch.fnmatchcase(top.value, p) for p in patterns)
            top.taken = top.active
        return i

    def _branch(self, word: str, value: bool | None, line: int, text: str) -> None:
        if word == "if":
            parent = self.reading()
            self.stack.append(_Frame("if", line, value if parent else False, label=f"`{text}` (line {line})"))
            frame = self.stack[-1]
            if not parent:
                return
        else:
            if not self.stack or self.stack[-1].kind != "if":
                return
            frame = self.stack[-1]
            frame.label = f"`{text}` (line {line})"
            if all(f.active is not False for f in self.stack[:-1]) is False:
                frame.active = False
                return
            frame.taken = frame.taken or frame.active is True
            frame.undecided = frame.undecided or frame.active is None
            if frame.taken:
                frame.active = False
                return
            if word == "else":
                frame.active = None if frame.undecided else True
                return
            frame.active = value if not frame.undecided or value is False else None
        if frame.active is None:
            self.notes.append(f"line {line}: `{text}` cannot be decided here (a value the script leaves to its "
                              f"caller; set it with --set NAME=VALUE): its branch is read")


__all__ = ["Flow", "condition"]
