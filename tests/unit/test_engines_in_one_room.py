"""Every voice engine lives in one room: its module in models/voices/, behind one interface
(models/voices/base.py, `VoiceBackend`), reached through `backend_for(voice)`.

Outside models/voices/ the code asks the backend what it needs and never tests which engine a
voice is. Read as source (nothing is imported for the scan): a comparison with an engine's
name (`voice.engine == "piper"`, `engine in NEURAL`), a lookup keyed by a voice's engine
(`{...}.get(voice.engine)`), or an import of the old engine constants fails here. At most
`ALLOWED` such tests may remain, each with a `#` comment saying why, on its line or the line
above. And every registered backend implements the whole interface.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from models.voices import ENGINE_NAMES, Voice, VoiceBackend, backend_for, backends, list_voices

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "web", "tasks", "workers", "ops", "models")
ROOM = ROOT / "models" / "voices"
# The constants that named the engines before they had a room of their own.
CONSTANTS = frozenset({"PIPER", "HIBARI", "ESPEAK", "NEURAL"})
NAMES = frozenset(ENGINE_NAMES)  # the engines' names, as strings in the code
ALLOWED = 2


def _names_an_engine(node: ast.AST) -> bool:
    """Whether `node` is, or holds, an engine's name as a string."""
    return any(isinstance(part, ast.Constant) and part.value in NAMES for part in ast.walk(node))


def _holds_a_constant(node: ast.AST) -> bool:
    """Whether `node` is, or holds, one of the old engine constants."""
    return any((isinstance(part, ast.Name) and part.id in CONSTANTS)
               or (isinstance(part, ast.Attribute) and part.attr in CONSTANTS)
               for part in ast.walk(node))


def _says_engine(node: ast.AST) -> bool:
    """Whether `node` reads something called an engine (`engine`, `x.engine_name`,
    `spec["engine"]`): what a string with an engine's name would be compared with."""
    return any((isinstance(part, ast.Name) and "engine" in part.id)
               or (isinstance(part, ast.Attribute) and "engine" in part.attr)
               or (isinstance(part, ast.Constant) and part.value == "engine")
               for part in ast.walk(node))


def _is_voice_engine(node: ast.AST) -> bool:
    """`x.engine` of anything but the inference engine's settings (`settings.engine`,
    `self.engine` in models/engine.py, which name torch or OpenVINO, no voice engine)."""
    return (isinstance(node, ast.Attribute) and node.attr == "engine"
            and not (isinstance(node.value, ast.Name)
                     and node.value.id in ("self", "settings", "chosen", "config")))


def engine_tests(source: str) -> list[tuple[int, str]]:
    """(line, what) of each engine-name test and engine-constant import in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_voice_engine(o) or _holds_a_constant(o) for o in operands) or (
                    any(_names_an_engine(o) for o in operands)
                    and any(_says_engine(o) for o in operands)):
                found.append((node.lineno, "compares with an engine's name"))
        elif isinstance(node, ast.Subscript) and _is_voice_engine(node.slice):
            found.append((node.lineno, "looks up by a voice's engine"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args and _is_voice_engine(node.args[0])):
            found.append((node.lineno, "looks up by a voice's engine"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("models.voices"):
            named = sorted(a.name for a in node.names if a.name in CONSTANTS)
            if named:
                found.append((node.lineno, f"imports {', '.join(named)}"))
        elif isinstance(node, ast.Attribute) and node.attr in CONSTANTS and isinstance(
                node.value, ast.Name) and node.value.id == "voices":
            found.append((node.lineno, f"reads voices.{node.attr}"))
    return sorted(found)


def _outside_the_room() -> list[Path]:
    return [path for top in PACKAGES for path in sorted((ROOT / top).rglob("*.py"))
            if ROOM not in path.parents]


def _has_reason(lines: list[str], line: int) -> bool:
    own = "#" in lines[line - 1]
    above = lines[line - 2].strip().startswith("#") if line >= 2 else False
    return own or above


def test_no_engine_name_is_tested_outside_models_voices():
    found = []
    for path in _outside_the_room():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        found += [(path.relative_to(ROOT), line, what, _has_reason(lines, line))
                  for line, what in engine_tests(source)]
    listing = "\n".join(f"{p}:{line}: {what}" for p, line, what, _ in found)
    assert len(found) <= ALLOWED, (
        f"{len(found)} engine-name tests outside models/voices/ (at most {ALLOWED}); ask "
        f"backend_for(voice) instead:\n{listing}")
    unexplained = [f"{p}:{line}: {what}" for p, line, what, reason in found if not reason]
    assert not unexplained, "an engine-name test without a comment saying why:\n" + "\n".join(
        unexplained)


def test_the_scan_sees_each_kind_of_engine_test():
    source = '''
from models.voices import HIBARI, get_voice
if voice.engine == "piper": pass
if spec.engine in NEURAL: pass
alphabet = {"piper": "ipa"}.get(voice.engine, "espeak")
rate = RATES[voice.engine]
if voices.PIPER: pass
if engine_name != "espeak": pass
if settings.engine == "openvino": pass
if phoneme_type == "espeak": pass
'''
    assert [line for line, _ in engine_tests(source)] == [2, 3, 4, 5, 6, 7, 8]
    assert engine_tests("if self.engine not in ENGINES: pass\n") == []


def _interface() -> tuple[dict[str, type], list[str]]:
    """The interface's class attributes (name -> type) and its methods."""
    attributes = {name: hint for name, hint in inspect.get_annotations(VoiceBackend).items()}
    methods = [name for name, member in vars(VoiceBackend).items()
               if inspect.isfunction(member) and not name.startswith("_")]
    return attributes, methods


def test_every_registered_backend_implements_the_whole_interface():
    attributes, methods = _interface()
    assert "list_voices" in methods and "acoustic_batch" in methods and "phonemes_are_ipa" in \
        attributes  # the interface was read
    registered = backends()
    assert tuple(b.name for b in registered) == ENGINE_NAMES
    assert {"piper", "hibari", "espeak"} <= set(ENGINE_NAMES)
    for backend in registered:
        cls = type(backend)
        assert isinstance(backend, VoiceBackend), cls
        assert not inspect.isabstract(cls), f"{cls.__name__} leaves methods abstract"
        for name, hint in attributes.items():
            assert hasattr(cls, name), f"{cls.__name__} does not say {name}"
            # The annotation's type inside ClassVar[...]: str unless it says otherwise.
            wanted = next((t for t in (bool, int, frozenset, tuple)
                           if f"[{t.__name__}" in str(hint)), str)
            assert isinstance(getattr(cls, name), wanted), f"{cls.__name__}.{name}"
        for name in methods:
            assert callable(getattr(backend, name)), f"{cls.__name__}.{name}"
    for name in ENGINE_NAMES:
        module = ROOM / f"{name}.py"
        assert module.is_file(), f"the engine {name} has no module of its own in models/voices/"


def test_every_offered_voice_has_its_engines_backend():
    voices = list_voices()
    assert {voice.engine for voice in voices} <= set(ENGINE_NAMES)
    for voice in voices:
        assert backend_for(voice).name == voice.engine
    for backend in backends():
        mine = backend.list_voices("")
        assert all(isinstance(v, Voice) and v.engine == backend.name for v in mine), backend.name
