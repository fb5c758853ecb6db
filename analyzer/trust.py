"""Which code a replay may run: the trust model.

Replaying a capture imports and calls the factories its ``meta.json`` names
(``"model": {"factory": "mypkg.models:make_mlp"}``). An analysed folder may come from
anyone, and a name such as ``os:system`` with JSON arguments would run a command, so, as
git's ``safe.directory`` and editors' trusted workspaces do, a factory is imported only
from a folder the user trusts:

- a folder given with ``--import-path`` (``import_paths=``), for that call;
- a folder recorded with ``forensics trust DIR``, kept in the user's configuration folder
  (``$FORENSICS_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/nan-forensics``, else
  ``~/.config/nan-forensics``), never in an analysed folder; its sub-folders too, except
  inside a capture's own run folder: code shipped with a run is trusted only when that
  folder itself (or one inside the run) was, so a stranger's run copied under a trusted
  project does not inherit its trust. The filesystem root and the home folder cannot be
  trusted;
- with ``--trust-code`` (``trust_code=True``), whichever folder the module is found in,
  for that call;
- the tool's own scenario factories (``analyzer.scenarios.models`` and ``.losses``, which
  ``sample_runs/`` use), which are part of the tool;
- the training script's saved copy in a capture (``source/__main__.py``, for factories of
  ``__main__``) when the sha256 of its bytes is among the trusted sources: the recorder adds
  the hash of the script it ran to trusted.json's ``"sources"`` on the machine that trained
  (:func:`analyzer.capture.code.register_trust`), with the roots of the factories' code
  as trusted folders. The hash is computed from the file, never read from meta.json.

Trusting a folder means: any public function or class defined there may be called with
arguments a stranger's meta.json chose. Whatever is trusted, a factory must be a plain
attribute name (``module:name``, no dots, no leading underscore) of a module with a file of
its own (not a namespace package) in the trusted folder, naming a callable defined in a
module under a trusted folder; the standard library, site-packages, builtins, frozen
modules and this tool's own source tree are never imported for a factory. The import loads
exactly the file judged: the folder goes first on ``sys.path`` and the spec the import
system would use is compared with it before any code runs. Optimizer classes are looked up
in ``torch.optim`` (already imported with torch), or else under the same rules. Two kinds
of installed code are allowed without trust, being code the user runs anyway and not code
from a folder: classes of ``torch.optim``, and model classes of the installed
``transformers`` (public subclasses of ``PreTrainedModel``, built from a config without
``auto_map``: no remote code). A factory of the training script (``__main__:name``) runs
only the script's top level under a private module name, as :func:`_check_main` and
:func:`_run_script` say.

Nothing here imports the module it judges: a module is located with
``importlib.machinery.PathFinder`` over candidate folders, which reads directory listings
only. The candidates, in order: the import paths, the trusted folders, the roots the
capture's ``"code"`` record names (searched, not trusted: they spare ``--import-path``),
the current folder, the folders on ``sys.path`` (outside the standard library and
site-packages), and the capture's run folder (so that a refusal can name the code shipped
with a run). When the module's file has another sha256 than the capture recorded, the
plan carries a note saying so; the replay runs today's file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import json
import linecache
import os
import shlex
import site
import sys
import sysconfig
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from analyzer.errors import ForensicsError, UsageError
from analyzer.ingest import storage
from analyzer.model import CodeRefusal

CONFIG_ENV = "FORENSICS_CONFIG_DIR"
CONFIG_FILE = "trusted.json"
BUILTIN_MODULES = frozenset({"analyzer.scenarios.models", "analyzer.scenarios.losses"})
"""The tool's own factory modules: they build small models and losses, nothing else."""


class UntrustedCode(ForensicsError):
    """A replay was not run: it would import code from a folder nobody trusted."""

    def __init__(self, target: str, folder: str, what: str = "import") -> None:
        self.target = target
        self.folder = folder
        self.command = f"forensics trust {shlex.quote(folder)}"
        super().__init__(
            f"replay not run: it would {what} `{target}` from {folder}, a folder not trusted "
            f"to run code; trust it with `{self.command}`, or pass --trust-code (or "
            f"--import-path {shlex.quote(folder)}) for one call")


class RefusedCode(ForensicsError):
    """A factory name that no trust makes importable (the standard library, a dunder...)."""

    def __init__(self, target: str, reason: str) -> None:
        self.target = target
        self.reason = reason
        super().__init__(f"replay not run: `{target}` {reason}")


def refusal_of(exc: BaseException) -> CodeRefusal | None:
    """The record of a replay not run for lack of trust, or None for other errors."""
    if isinstance(exc, UntrustedCode):
        return CodeRefusal(exc.target, str(exc), exc.folder, exc.command)
    if isinstance(exc, RefusedCode):
        return CodeRefusal(exc.target, str(exc))
    return None


# --- the user's list of trusted folders ------------------------------------------------


def config_dir() -> str:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "nan-forensics")


def config_path() -> str:
    return os.path.join(config_dir(), CONFIG_FILE)


def _config() -> dict[str, Any]:
    """trusted.json as it stands; a missing or damaged file is an empty one."""
    try:
        with open(config_path(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def trusted_folders() -> tuple[str, ...]:
    """The folders recorded with ``forensics trust``; a missing or damaged file is none."""
    folders = _config().get("trusted")
    if not isinstance(folders, list):
        return ()
    return tuple(f for f in folders if isinstance(f, str) and os.path.isabs(f))


def trusted_sources() -> frozenset[str]:
    """The sha256 hashes of code the recorder ran on this machine (the ``"sources"`` list
    of trusted.json, which version 1 readers ignore): a capture's saved training script
    with one of these hashes is the user's own code."""
    from analyzer.capture.coderef import is_sha256

    sources = _config().get("sources")
    if not isinstance(sources, list):
        return frozenset()
    return frozenset(s for s in sources if is_sha256(s))


def _save(folders: Sequence[str], sources: Sequence[str] | None = None) -> None:
    kept = sorted(trusted_sources()) if sources is None else list(sources)
    folder = config_dir()
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{CONFIG_FILE}.{os.getpid()}")
    data: dict[str, Any] = {"version": 1, "trusted": list(folders)}
    if kept:
        data["sources"] = kept
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, config_path())


def trust_sources(hashes: Sequence[str]) -> None:
    """Record sha256 hashes of code as trusted (keys only added to trusted.json)."""
    from analyzer.capture.coderef import is_sha256

    held = trusted_sources()
    new = [h for h in dict.fromkeys(hashes) if is_sha256(h) and h not in held]
    if new:
        _save(trusted_folders(), sorted(held | set(new)))


def trust_folder(path: str) -> str:
    """Record ``path`` as trusted; its real path, as recorded."""
    real = os.path.realpath(path)
    reason = _untrustable(real)
    if reason is not None:
        raise UsageError(f"{path}: {reason}")
    held = trusted_folders()
    if real not in held:
        _save([*held, real])
    return real


def _untrustable(real: str) -> str | None:
    """Why the folder ``real`` (a real path) cannot be trusted, or None when it can."""
    if not os.path.isdir(real):
        return "not a folder"
    if real in (os.path.dirname(real), os.path.realpath(os.path.expanduser("~"))):
        return ("the filesystem root or your home folder would trust every folder below it, "
                "run folders included; trust the project's folder")
    if is_system(real):
        return ("lies in the standard library or site-packages; code there is never "
                "imported for a replay, so it cannot be trusted")
    return None


def distrust_folder(path: str) -> bool:
    """Forget ``path``; False when it was not recorded."""
    real = os.path.realpath(path)
    held = trusted_folders()
    if real not in held and path not in held:
        return False
    _save([f for f in held if f not in (real, path)])
    return True


# --- the policy of one call -------------------------------------------------------------


@dataclass(frozen=True)
class TrustPolicy:
    """What one analysis or replay may import: ``import_paths`` and the recorded folders
    are trusted; ``trust_code`` trusts wherever the module is found."""

    import_paths: tuple[str, ...] = ()
    trust_code: bool = False
    folders: tuple[str, ...] = field(default_factory=trusted_folders)

    @classmethod
    def of(cls, import_paths: Sequence[str] = (), trust_code: bool = False) -> TrustPolicy:
        return cls(tuple(os.path.realpath(p) for p in import_paths), trust_code)

    def trusts(self, folder: str, run_folder: str | None = None) -> bool:
        """Whether code in ``folder`` may run. A trusted folder trusts the folders below it,
        except inside the capture's own run folder: code shipped with a run is trusted
        only when that folder (or one inside the run) was trusted itself, never because a
        folder above the run was."""
        if self.trust_code:
            return True
        roots = (*self.import_paths, *self.folders)
        if run_folder is not None and _inside(run_folder, folder):
            roots = tuple(r for r in roots if _inside(run_folder, r))
        return any(_inside(root, folder) for root in roots)


@dataclass(frozen=True)
class Resolved:
    """A factory found and judged: its object, and the folder it was imported from (None
    for the tool's own and torch's)."""

    obj: Any
    folder: str | None


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@functools.cache
def _system_folders() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                     "platlib")}
    with contextlib.suppress(AttributeError):
        paths.update(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        paths.add(site.getusersitepackages())
    return tuple(os.path.realpath(p) for p in paths if p)


def is_system(path: str) -> bool:
    return any(_inside(s, path) for s in _system_folders())


def _candidates(policy: TrustPolicy, run_folder: str | None,
                roots: Sequence[str] = ()) -> list[str]:
    # The roots a capture records are searched, not trusted: they spare --import-path.
    out = [*policy.import_paths, *policy.folders, *roots, os.getcwd()]
    out += [p or os.getcwd() for p in sys.path if isinstance(p, str)]
    if run_folder is not None:  # code shipped with the run: found, to be named, not trusted
        out.append(run_folder)
    seen: dict[str, None] = {}
    for p in out:
        real = os.path.realpath(p)
        if os.path.isdir(real) and not is_system(real):
            seen.setdefault(real, None)
    return list(seen)


def _split(target: str, separator: str) -> tuple[str, str]:
    if separator == ".":
        module, _, attr = target.rpartition(".")
    else:
        module, _, attr = target.partition(":")
    parts = module.split(".")
    if not module or not attr or not all(p.isidentifier() for p in parts):
        raise RefusedCode(target, f"is not of the form 'module{separator}name'")
    if not attr.isidentifier() or attr.startswith("_") or any(p.startswith("__") for p in parts):
        raise RefusedCode(target, "does not name a plain public attribute of a module")
    return module, attr


def _module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if isinstance(path, str) else None


def _locate(top: str, candidates: list[str]) -> str | None:
    """The first candidate folder holding the top-level module or package ``top`` as a
    file of its own (``top.py`` or ``top/__init__.py``): a namespace package, which any
    plain folder makes, does not count."""
    for folder in candidates:
        spec = importlib.machinery.PathFinder.find_spec(top, [folder])
        if _spec_file(spec) is not None and _inside(folder, _spec_file(spec) or ""):
            return folder
    return None


def _spec_file(spec: Any) -> str | None:
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or origin in ("namespace", "built-in", "frozen"):
        return None
    return os.path.realpath(origin) if os.path.isfile(origin) else None


def tool_root() -> str:
    """The folder holding this tool's packages (a source checkout's root, or
    site-packages): nothing found directly in it is a factory."""
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


Source = Literal["folder", "tool", "torch", "main", "library"]


@dataclass(frozen=True)
class Plan:
    """Where a factory would come from, judged without importing it: ``folder`` for code
    under a trusted folder, ``tool`` for the tool's own factories, ``torch`` for a class
    of ``torch.optim``, ``library`` for a model class of the installed transformers,
    ``main`` for the training script (``file``, whose bytes ``script`` were read when
    judged and are what runs). ``notes`` say what a replay should know, such as code
    changed since the capture."""

    target: str
    module: str
    attr: str
    source: Source
    folder: str | None = None
    notes: tuple[str, ...] = ()
    file: str | None = None
    script: bytes | None = field(default=None, repr=False)
    shown: str | None = None
    """The name the script's code is compiled under, so that source lines name the user's
    script (``train.py:12``) when its saved copy runs; None: ``file``."""


def check(target: str, policy: TrustPolicy, *, run_folder: str | None = None,
          separator: str = ":", code: Mapping[str, Any] | None = None,
          capture_folder: str | None = None) -> Plan:
    """Judge the factory ``target`` without importing it.

    ``code`` is the capture's ``"code"`` record (None for a version 1 capture): its roots
    are searched after the import paths and the trusted folders (searched, not trusted),
    and a module whose file has another hash than recorded gets a note. A factory of the
    training script (``__main__:name``) is judged by :func:`_check_main`, which reads the
    saved copy in ``capture_folder`` (the capture's ``step_<N>`` folder).

    Raises :class:`RefusedCode` for what no trust allows, :class:`UntrustedCode` for a
    folder not trusted, and ``ModelRebuildError`` when no candidate folder holds it.
    """
    from analyzer.capture.coderef import recorded_roots
    from analyzer.replayer.errors import ModelRebuildError

    head, _, attr = target.rpartition(".") if separator == "." else target.partition(":")
    if head == "__main__":
        return _check_main(target, attr, policy, run_folder, code, capture_folder)
    module_name, attr = _split(target, separator)
    if separator == "." and (module_name + ".").startswith("torch.optim."):
        return Plan(target, module_name, attr, "torch")
    if module_name in BUILTIN_MODULES:
        return Plan(target, module_name, attr, "tool")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise RefusedCode(target, f"names the standard library module {top!r}, which a replay "
                                  "never imports")
    if top in ("analyzer", "app"):
        raise RefusedCode(target, "names a module of this tool that builds no model or loss")
    if _is_library(module_name) and separator == ":":
        return Plan(target, module_name, attr, "library")
    folder = _locate(top, _candidates(policy, run_folder, recorded_roots(code)))
    if folder is not None and os.path.realpath(folder) == tool_root():
        raise RefusedCode(target, "names a module of this tool's own source tree, which builds "
                                  "no model or loss")
    if folder is None:
        if top in sys.modules or _installed(top):
            raise RefusedCode(target, f"names {top!r}, which is installed (site-packages) or "
                                      "already loaded, not in a folder a replay imports "
                                      "factories from; pass its source folder with "
                                      "--import-path")
        raise ModelRebuildError(target, f"module {top!r} cannot be imported; add the folder "
                                        "that holds it with --import-path", module=top)
    if not policy.trusts(folder, run_folder):
        raise UntrustedCode(target, folder)
    loaded = sys.modules.get(top)
    where = _module_file(loaded) if loaded is not None else None
    if loaded is not None and (where is None or not _inside(folder, where)):
        raise RefusedCode(target, f"names {top!r}, already loaded here, and not from {folder}")
    return Plan(target, module_name, attr, "folder", folder,
                notes=_changed(module_name, folder, code))


def _changed(module_name: str, folder: str, code: Mapping[str, Any] | None) -> tuple[str, ...]:
    """A note when the module's file in ``folder`` is not the one the capture recorded."""
    from analyzer.capture.coderef import recorded_modules

    recorded = recorded_modules(code).get(module_name)
    if recorded is None or recorded.sha256 is None:
        return ()
    file = _submodule_file(module_name, folder)
    if file is None:
        return ()
    return _hash_note(os.path.relpath(file, folder), recorded.sha256, _read_code(file))


def _hash_note(name: str, recorded: str, data: bytes | None) -> tuple[str, ...]:
    from analyzer.capture.coderef import sha256_of

    now = sha256_of(data) if data is not None else None
    if now == recorded:
        return ()
    today = f"{now[:12]} now" if now else "unreadable now"
    return (f"{name} changed since the capture (sha256 {recorded[:12]} then, {today}); "
            "replayed with today's file",)


def _submodule_file(module_name: str, folder: str) -> str | None:
    """The file ``module_name`` would load from ``folder``, found from directory listings."""
    search: list[str] | None = [folder]
    spec = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        if not search:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
    return _spec_file(spec)


def _read_code(path: str) -> bytes | None:
    """A script or module file's bytes (regular files only, bounded), or None."""
    from analyzer.capture.coderef import SOURCE_LIMIT
    from analyzer.ingest.safeio import read_regular

    try:
        data = read_regular(path, SOURCE_LIMIT + 1)
    except (OSError, ValueError):
        return None
    return data if len(data) <= SOURCE_LIMIT else None


def _check_main(target: str, attr: str, policy: TrustPolicy, run_folder: str | None,
                code: Mapping[str, Any] | None, capture_folder: str | None) -> Plan:
    """Judge a factory of the training script. What runs, in order:

    1. the capture's saved copy (``source/__main__.py``), when the sha256 of its bytes
       (computed here, never read from meta.json) is a trusted source, or the folder
       holding it is trusted (``--trust-code`` trusts it too);
    2. else the script at its recorded place, when its folder is trusted (with a note when
       it changed since the capture);
    3. else nothing: :class:`UntrustedCode` names the script's folder (or, when the script
       is gone, the saved copy's), which ``forensics trust`` fixes.
    """
    from analyzer.capture.coderef import SAVED_MAIN, recorded_main, sha256_of
    from analyzer.replayer.errors import ModelRebuildError

    if not attr.isidentifier() or attr.startswith("_"):
        raise RefusedCode(target, "does not name a plain public attribute of a module")
    script = recorded_main(code)
    if script is None:
        raise RefusedCode(target, "names the training script (__main__), and the capture "
                                  "records no script to run it from")
    root = script.root if script.root and _inside(script.root, script.file) else None
    trusted_root = root if root and os.path.isdir(root) and not is_system(root) and \
        policy.trusts(root, run_folder) else None
    saved = storage.join(capture_folder, SAVED_MAIN) if capture_folder else None
    if saved is not None and _present(saved):
        data = _read_code(saved)
        if data is not None and (sha256_of(data) in trusted_sources()
                                 or policy.trusts(os.path.dirname(saved), run_folder)):
            shown = script.file if script.file.endswith(".py") else None
            return Plan(target, "__main__", attr, "main", trusted_root, file=saved, script=data,
                        shown=shown)
    folder = os.path.dirname(script.file)
    present = script.file.endswith(".py") and os.path.isfile(script.file)
    if present and policy.trusts(folder, run_folder) and not is_system(script.file):
        data = _read_code(script.file)
        if data is not None:
            notes = _hash_note(os.path.basename(script.file), script.sha256, data) \
                if script.sha256 else ()
            return Plan(target, "__main__", attr, "main", trusted_root, notes=notes,
                        file=script.file, script=data)
    offered = [f for f in (root, folder) if f and _untrustable(os.path.realpath(f)) is None]
    if present and offered:
        raise UntrustedCode(target, offered[0], "run")
    if saved is not None and not storage.is_url(saved) and os.path.isfile(saved):
        raise UntrustedCode(target, os.path.dirname(saved), "run")
    if present:
        raise RefusedCode(target, f"would run {script.file}, in a folder that cannot be "
                                  f"trusted ({_untrustable(os.path.realpath(folder))}); pass "
                                  "--trust-code for one call")
    raise ModelRebuildError(target, f"the training script {script.file} is gone and the "
                                    "capture holds no saved copy of it")


def _present(path: str) -> bool:
    """Whether the saved script is there: a capture read from a store keeps it as an object
    (read like any of the capture's files; its hash still decides whether it runs)."""
    return storage.exists(path) if storage.is_url(path) else os.path.lexists(path)


def _is_library(module_name: str) -> bool:
    """A model class of the installed transformers, named at its top level or in its
    ``transformers.models`` modules: installed code the user runs anyway."""
    if module_name != "transformers" and not module_name.startswith("transformers.models."):
        return False
    loaded = sys.modules.get("transformers")
    where = _module_file(loaded) if loaded is not None else _installed_file("transformers")
    return where is not None and is_system(where)


def _installed_file(top: str) -> str | None:
    try:
        return _spec_file(importlib.util.find_spec(top))
    except (ImportError, ValueError):
        return None


def check_model_config(target: str, config: Mapping[str, Any]) -> None:
    """Refuse a Hugging Face config that asks for code from elsewhere (``auto_map``,
    ``trust_remote_code``): a library model class is built from its own code only."""
    for key in ("auto_map", "trust_remote_code"):
        if key in config:
            raise RefusedCode(target, f"comes with a config holding {key!r}: code from outside "
                                      "the installed library is never run")


def resolve(target: str, policy: TrustPolicy, *, run_folder: str | None = None,
            separator: str = ":", code: Mapping[str, Any] | None = None,
            capture_folder: str | None = None) -> Resolved:
    """Judge the factory ``target`` as :func:`check` does, then import it."""
    plan = check(target, policy, run_folder=run_folder, separator=separator, code=code,
                 capture_folder=capture_folder)
    return resolve_plan(plan, policy, run_folder=run_folder)


def resolve_plan(plan: Plan, policy: TrustPolicy, *, run_folder: str | None = None) -> Resolved:
    """Import what a :func:`check` judged, and check what came of it."""
    from analyzer.replayer.errors import ModelRebuildError

    target = plan.target
    if plan.source == "torch":
        module = sys.modules.get(plan.module)  # imported with torch: nothing new runs
        obj = vars(module).get(plan.attr) if module is not None else None
        if not isinstance(obj, type):
            raise RefusedCode(target, "is not a class of torch.optim")
        return Resolved(obj, None)
    if plan.source == "tool":
        module = importlib.import_module(plan.module)
        obj = vars(module).get(plan.attr)
        if not callable(obj) or getattr(obj, "__module__", None) != plan.module:
            raise RefusedCode(target, f"is not a factory of the tool's module {plan.module}")
        return Resolved(obj, None)
    if plan.source == "library":
        return Resolved(_library_class(plan), None)
    if plan.source == "main":
        module = _run_script(plan, policy.import_paths)
        obj = vars(module).get(plan.attr)
        if obj is None:
            raise ModelRebuildError(target, f"the training script defines no {plan.attr!r} "
                                            "at its top level")
        if not callable(obj) or getattr(obj, "__module__", None) != module.__name__:
            raise RefusedCode(target, "is not a function or class defined in the training "
                                      "script")
        return Resolved(obj, plan.folder)
    assert plan.folder is not None
    module = _import(target, plan.module, plan.folder)
    obj = vars(module).get(plan.attr)
    if obj is None:
        raise ModelRebuildError(target, f"module {plan.module!r} has no attribute {plan.attr!r}")
    defined = sys.modules.get(getattr(obj, "__module__", "") or "")
    where = _module_file(defined) if defined is not None else None
    if (not callable(obj) or where is None or is_system(where)
            or not policy.trusts(os.path.dirname(where), run_folder)):
        raise RefusedCode(target, "is not a function or class defined under the trusted folder")
    return Resolved(obj, plan.folder)


def _library_class(plan: Plan) -> Any:
    from analyzer.replayer.errors import ModelRebuildError

    target = plan.target
    where = _installed_file("transformers") if "transformers" not in sys.modules else None
    if "transformers" not in sys.modules and (where is None or not is_system(where)):
        raise RefusedCode(target, "transformers would not be loaded from site-packages")
    try:
        module = importlib.import_module("transformers")
        base = getattr(module, "PreTrainedModel", None)
        obj = getattr(module, plan.attr, None)  # transformers imports its own submodule
    except Exception as exc:
        raise ModelRebuildError(target, f"importing it from transformers raised "
                                        f"{type(exc).__name__}: {exc}") from None
    loaded = _module_file(module)
    if loaded is None or not is_system(loaded):
        raise RefusedCode(target, f"transformers was loaded from {loaded}, not site-packages")
    if not (isinstance(obj, type) and isinstance(base, type) and issubclass(obj, base)
            and obj is not base):
        raise RefusedCode(target, "is not a model class of the installed transformers (a "
                                  "public subclass of transformers.PreTrainedModel)")
    if plan.module != "transformers" and obj.__module__ != plan.module:
        raise RefusedCode(target, f"is not the class transformers.{plan.attr} defined in "
                                  f"{plan.module}")
    return obj


def _run_script(plan: Plan, import_paths: Sequence[str] = ()) -> types.ModuleType:
    """Run the top level of the training script (see
    :func:`analyzer.capture.code.top_level_code` for exactly which statements) as a fresh
    module under a private name, never ``__main__``, with ``sys.argv`` holding only the
    script's path (an argument parser at the top level sees no arguments) and its root,
    when trusted, and the call's import paths first on ``sys.path``. The same bytes give
    the same module, run once."""
    from analyzer.capture.coderef import sha256_of, top_level_code
    from analyzer.replayer.errors import ModelRebuildError

    assert plan.script is not None and plan.file is not None
    digest = sha256_of(plan.script)
    name = f"_forensics_script_{digest[:16]}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__forensics_sha256__", None) == digest:
        return loaded
    shown = plan.shown or plan.file
    try:
        code = top_level_code(plan.script, shown)
    except (SyntaxError, ValueError) as exc:
        raise ModelRebuildError(plan.target, f"the training script {plan.file} is not "
                                             f"Python: {exc}") from None
    if shown != plan.file:
        # The lines a report quotes are those of the code that ran (the saved copy), under
        # the name the script had when it trained.
        text = plan.script.decode("utf-8", "replace")
        linecache.cache[shown] = (len(text), None, text.splitlines(True), shown)
    module = types.ModuleType(name)
    module.__file__ = plan.file
    vars(module)["__forensics_sha256__"] = digest
    sys.modules[name] = module  # dataclasses and pickling look classes up there
    argv = sys.argv
    sys.argv = [plan.file]
    try:
        with import_path([*([plan.folder] if plan.folder else []), *import_paths]):
            exec(code, vars(module))
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        hint = ("; a replay skips the script's top-level calls, sys.path.insert(...) among "
                "them: give that folder with --import-path"
                if isinstance(exc, ImportError) else "")
        raise ModelRebuildError(plan.target, f"running the top level of the training script "
                                             f"{plan.file} raised {type(exc).__name__}: "
                                             f"{exc}{hint}") from None
    finally:
        sys.argv = argv
    return module


def _installed(top: str) -> bool:
    """Whether ``top`` can be imported from outside the candidate folders (site-packages,
    an editable install's finder); finding a top-level spec runs no module code."""
    try:
        return _spec_file(importlib.util.find_spec(top)) is not None
    except (ImportError, ValueError):
        return False


def _import(target: str, module_name: str, folder: str) -> Any:
    from analyzer.replayer.errors import ModelRebuildError

    with import_path([folder]):
        top = module_name.split(".")[0]
        if top not in sys.modules:
            # What the import system would load, found without running it: it must be the
            # file judged, not one earlier on sys.path or from another finder.
            found = _spec_file(importlib.util.find_spec(top))
            if found is None or not _inside(folder, found):
                raise RefusedCode(target, f"module {top!r} would not be loaded from {folder} "
                                          f"but from {found or 'elsewhere'}")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
            raise ModelRebuildError(target, f"module {missing!r} cannot be imported; add the "
                                            "folder that holds it with --import-path",
                                    module=missing) from None
        except Exception as exc:
            raise ModelRebuildError(target, f"importing module {module_name!r} raised "
                                            f"{type(exc).__name__}: {exc}",
                                    module=module_name) from None
    where = _module_file(module)
    if where is None or not _inside(folder, where):
        raise RefusedCode(target, f"module {module_name!r} was not loaded from {folder}")
    return module


@contextlib.contextmanager
def import_path(paths: Sequence[str]) -> Iterator[None]:
    """Put ``paths`` first on sys.path while trusted code is imported and run.

    Bytecode caching is off meanwhile: importing must not write ``__pycache__`` folders
    into a folder being analysed.
    """
    added = [os.path.abspath(p) for p in paths]  # first, even when already further down
    sys.path[:0] = added
    no_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = no_bytecode
        for p in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(p)
