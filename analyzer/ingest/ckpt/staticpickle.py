"""Reading a pickle without running it.

The opcodes are walked with :func:`pickletools.genops` (a parser: it imports nothing and
calls nothing) and a stack machine rebuilds the data with stand-ins for everything a
real unpickler would import: :class:`Global` for a name, :class:`Call` for what calling
it would have made, :class:`Obj` for an instance with its state. Tensors written by
``torch.save`` are recognised by their rebuild functions and become :class:`TensorRef`
values that say where their bytes are.
"""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field

from analyzer.ingest.ckpt.quoting import foreign

MAX_OPS = 20_000_000

_TENSOR_REBUILDERS = {
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
}
_PARAMETER_REBUILDERS = {
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
}
_DICT_FACTORIES = {"collections.OrderedDict", "builtins.dict", "__builtin__.dict"}
_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"
"""``(func, type, args, state)``: a tensor with Python attributes, rebuilt by ``func``."""


@dataclass(frozen=True)
class Global:
    """A name the pickle would import."""

    name: str


@dataclass(frozen=True)
class StorageRef:
    """A persistent id of a torch storage: the archive key of its bytes."""

    dtype: str
    key: str
    location: str
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """A tensor as the pickle describes it; its values stay in the archive.

    ``offset`` and ``stride`` count elements of the tensor's dtype, which is the
    storage's unless ``dtype`` names another (``_rebuild_tensor_v3`` over an untyped
    storage)."""

    storage: StorageRef | None
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str | None = None
    problem: str | None = None
    """Why the description cannot be a tensor (a size or stride that is not integers)."""

    @property
    def dtype_name(self) -> str:
        if self.dtype is not None:
            return self.dtype
        return self.storage.dtype if self.storage is not None else "unknown"

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def contiguous(self) -> bool:
        expected = 1
        for dim, step in zip(reversed(self.shape), reversed(self.stride), strict=False):
            if dim != 1 and step != expected:
                return False
            expected *= dim
        return True


@dataclass
class Obj:
    """An instance the pickle would build, with the state it would give it."""

    cls: str
    args: tuple[object, ...] = ()
    state: object = None


@dataclass
class Call:
    """The result of calling a global that is not understood here."""

    func: str
    args: tuple[object, ...] = ()


@dataclass
class StaticResult:
    """What a static read recovered. ``error`` says where and why it stopped early."""

    root: object = None
    globals_seen: list[str] = field(default_factory=list)
    error: str | None = None
    error_offset: int | None = None
    end: int = 0
    storages: dict[str, StorageRef] = field(default_factory=dict)
    """Every storage the pickle names, by archive key (the first description of each)."""
    tensors: list[TensorRef] = field(default_factory=list)
    """Every tensor the pickle builds, in the order it builds them."""
    opcodes: set[str] = field(default_factory=set)
    """Every opcode the pickle uses."""
    unlike_torch: str | None = None
    """The first step where torch's ``weights_only`` unpickler could read the pickle
    otherwise than this reader (:mod:`wopredict`), or None: an append to something not
    a list, a state given to something not an ``OrderedDict``, a call this reader only
    stands in for, a stack item taken from below a MARK."""


_MARK = object()
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}
_STORAGE_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "Float8_e4m3fnStorage": "float8_e4m3fn",
    "Float8_e5m2Storage": "float8_e5m2",
}
TORCH_STORAGES = frozenset(_STORAGE_DTYPES) - {"Float8_e4m3fnStorage", "Float8_e5m2Storage"}
"""The typed storages torch defines, which its weights_only unpickler allows and
``torch.save`` names; float8 has none (it is saved through ``UntypedStorage``): a pickle
naming one is not torch's."""


def _storage_dtype(value: object) -> str:
    if isinstance(value, Global):
        leaf = value.name.rsplit(".", 1)[-1]
        if leaf in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[leaf]
        if value.name == "torch.UntypedStorage":
            return "uint8"  # as torch.load reads it: bytes, the tensor says its own dtype
        if value.name.startswith("torch.") and value.name.count(".") == 1:
            return leaf  # a dtype given directly, as UntypedStorage saves do
        return value.name
    return "unknown"


def _persistent(pid: object) -> object:
    if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
        numel = pid[4] if isinstance(pid[4], int) and not isinstance(pid[4], bool) else -1
        return StorageRef(_storage_dtype(pid[1]), _text(pid[2]), _text(pid[3]), numel)
    return Call("persistent_load", (pid,))


def _dtype_arg(value: object) -> str | None:
    if isinstance(value, Global) and value.name.startswith("torch."):
        return value.name.removeprefix("torch.")
    return None


def _as_ints(value: object) -> tuple[int, ...] | None:
    if isinstance(value, tuple | list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    if isinstance(value, Call) and value.func == "torch.Size" and value.args:
        return _as_ints(value.args[0])
    return None


def _tensor_ref(name: str, argv: tuple[object, ...]) -> TensorRef:
    storage = argv[0] if isinstance(argv[0], StorageRef) else None
    offset = argv[1] if isinstance(argv[1], int) and not isinstance(argv[1], bool) else -1
    dtype = _dtype_arg(argv[6]) if name.endswith("_v3") and len(argv) > 6 else None
    shape, stride = _as_ints(argv[2]), _as_ints(argv[3])
    if shape is None or stride is None:
        return TensorRef(storage, offset, (), (), dtype, "size or stride is not a list of ints")
    return TensorRef(storage, offset, shape, stride, dtype)


def _text(value: object) -> str:
    """A storage key or location as text: itself when a string (as torch.save writes it),
    a small int's digits, else what kind of value it is."""
    if isinstance(value, str):
        return value
    if type(value) is int and abs(value) < 10**18:
        return str(value)
    return _label(value)


def _label(value: object) -> str:
    """A name for a value the file chose, made without rendering it: a pickle can build a
    list that holds itself twice at each of forty levels (a few hundred bytes through its
    memo), whose repr or hash would take 2**40 steps."""
    if isinstance(value, Global):
        return value.name
    if isinstance(value, Obj):
        return f"<{value.cls} instance>"
    if isinstance(value, Call):
        return f"<result of {value.func}>"
    return f"<{type(value).__name__}>"


_ATOMS = (str, bytes, int, float, bool, type(None), Global)


def _keyable(value: object) -> bool:
    """Whether ``value`` hashes in bounded time: an atom, a stand-in for a name, or tuples
    of those nesting at most ``_KEY_ITEMS`` items in all, shared ones counted each time (a
    tuple's hash is not kept: one made of itself twice at each level costs 2**depth)."""
    if isinstance(value, _ATOMS):
        return True
    if type(value) is not tuple:
        return False
    pending, budget = [value], _KEY_ITEMS
    while pending:
        item = pending.pop()
        budget -= 1
        if budget < 0:
            return False
        if type(item) is tuple:
            pending.extend(item)
        elif not isinstance(item, _ATOMS):
            return False
    return True


_KEY_ITEMS = 4096


def _unhashable(value: object) -> bool:
    """Whether hashing ``value`` would fail in the real unpickler (a list, dict or set, or
    a tuple holding one): each distinct tuple looked into once, up to a bound, past which
    the key counts as one torch would not take either."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if isinstance(item, list | dict | set | bytearray):
            return True
        if type(item) is tuple and id(item) not in seen:
            seen.add(id(item))
            if len(seen) > _KEY_ITEMS:
                return True
            pending.extend(item)
    return False


def _call(func: object, args: object) -> object:
    name = func.name if isinstance(func, Global) else _label(func)
    argv = args if isinstance(args, tuple) else (args,)
    if name in _TENSOR_REBUILDERS and len(argv) >= 4:
        return _tensor_ref(name, argv)
    if name == _FROM_TYPE and len(argv) >= 3:
        return _call(argv[0], argv[2])
    if name in _PARAMETER_REBUILDERS and argv:
        return argv[0]
    if name in _DICT_FACTORIES:
        return {}
    if name == "torch.Size" and argv:
        size = _as_ints(argv[0])
        return size if size is not None else Call(name, argv)
    return Call(name, argv)


def dict_key(value: object) -> object:
    """A value usable as a dict key: itself when it hashes in bounded time (see
    ``_keyable``), else a name for it (``_label``)."""
    return value if _keyable(value) else _label(value)


class _Machine:
    def __init__(self) -> None:
        self.stack: list[object] = []
        self.memo: dict[object, object] = {}
        self.result = StaticResult()
        self.seen: set[str] = set()
        self.ordered: dict[int, object] = {}
        """The maps made by ``OrderedDict()``, by id (kept, so that no id is reused)."""

    def unlike(self, why: str) -> None:
        if self.result.unlike_torch is None:
            self.result.unlike_torch = why

    def top(self, count: int) -> None:
        """Note when one of the ``count`` top items is a MARK or missing: torch's
        unpickler keeps what lies below a MARK out of reach."""
        if len(self.stack) < count or any(x is _MARK for x in self.stack[-count:]):
            self.unlike("an opcode reaches below a MARK")

    def check_reduce(self, func: object, args: object, made: object) -> None:
        name = func.name if isinstance(func, Global) else None
        argv = args if isinstance(args, tuple) else None
        if name == "collections.OrderedDict" and argv == () and isinstance(made, dict):
            self.ordered[id(made)] = made
        elif name == "torch._utils._rebuild_tensor_v2" and argv is not None and len(argv) == 6:
            _, offset, size, stride, grad, hooks = argv
            plain = isinstance(offset, int) and _as_ints(size) is not None and \
                _as_ints(stride) is not None and isinstance(size, tuple) and \
                isinstance(stride, tuple) and isinstance(grad, bool)
            if not (plain and isinstance(argv[0], StorageRef) and self.empty_ordered(hooks)):
                self.unlike("a tensor rebuilt from arguments torch.save does not write")
        elif name == "torch._utils._rebuild_parameter" and argv is not None and len(argv) == 3:
            if not (isinstance(argv[0], TensorRef) and isinstance(argv[1], bool)
                    and self.empty_ordered(argv[2])):
                self.unlike("a parameter rebuilt from arguments torch.save does not write")
        else:
            self.unlike(f"a call of {name or 'a non-global'} this reader only stands in for")

    def empty_ordered(self, value: object) -> bool:
        return isinstance(value, dict) and not value and id(value) in self.ordered

    def pop_mark(self) -> list[object]:
        items: list[object] = []
        while self.stack:
            item = self.stack.pop()
            if item is _MARK:
                items.reverse()
                return items
            items.append(item)
        raise ValueError("MARK expected on the stack")

    def check_target(self, target: object, kind: type, keys: list[object]) -> None:
        if type(target) is not kind:
            self.unlike(f"an item added to something not a {kind.__name__}")
        for key in keys:
            if not _keyable(key) and _unhashable(key):
                self.unlike("a key that is not hashable")

    def persistent(self, pid: object) -> object:
        ref = _persistent(pid)
        if isinstance(ref, StorageRef):
            self.result.storages.setdefault(ref.key, ref)
        return ref

    def global_(self, name: str) -> None:
        module, _, qual = name.partition(".")
        # Protocol 2 pickles written by Python 3 spell some modules the Python 2 way.
        name = f"{_PY2_MODULES.get(module, module)}.{qual}"
        if name not in self.seen:  # a set: a hostile pickle may name a million globals
            self.seen.add(name)
            self.result.globals_seen.append(name)
        self.stack.append(Global(name))

    def step(self, name: str, arg: object) -> bool:
        stack = self.stack
        # The most frequent opcodes of a torch.save pickle come first.
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name == "BINPUT" or name == "LONG_BINPUT" or name == "PUT":
            self.top(1)
            self.memo[arg] = stack[-1]
        elif name == "BINGET" or name == "LONG_BINGET" or name == "GET":
            stack.append(self.memo[arg])
        elif name == "MARK":
            stack.append(_MARK)
        elif name in _PUSH_CONST:
            stack.append(_PUSH_CONST[name])
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("EMPTY_SET",):
            stack.append([])
        elif name in ("TUPLE", "FROZENSET"):
            stack.append(tuple(self.pop_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            self.top(n)
            packed = tuple(stack[-n:])
            del stack[-n:]
            stack.append(packed)
        elif name == "LIST":
            stack.append(self.pop_mark())
        elif name == "DICT":
            items = self.pop_mark()
            stack.append({dict_key(k): v for k, v in zip(items[::2], items[1::2], strict=False)})
        elif name == "APPEND":
            self.top(2)
            value = stack.pop()
            self.check_target(stack[-1], list, [])
            _append(stack[-1], [value])
        elif name in ("APPENDS", "ADDITEMS"):
            items = self.pop_mark()
            self.top(1)
            self.check_target(stack[-1], list, [])
            _append(stack[-1], items)
        elif name == "SETITEM":
            self.top(3)
            value, key = stack.pop(), stack.pop()
            self.check_target(stack[-1], dict, [key])
            _setitems(stack[-1], [key, value])
        elif name == "SETITEMS":
            items = self.pop_mark()
            self.top(1)
            self.check_target(stack[-1], dict, items[::2])
            if len(items) % 2:
                self.unlike("SETITEMS with a key and no value")
            _setitems(stack[-1], items)
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = stack[-1]
        elif name == "GLOBAL" or name == "INST":
            module, _, qual = str(arg).partition(" ")
            self.global_(f"{module}.{qual}")
            if name == "INST":
                stack.pop()  # the INST name was pushed as a Global just above
                stack.append(Obj(f"{module}.{qual}", tuple(self.pop_mark())))
        elif name == "STACK_GLOBAL":
            qual_name, module_name = stack.pop(), stack.pop()
            if not (isinstance(qual_name, str) and isinstance(module_name, str)):
                self.unlike("a STACK_GLOBAL of names that are not strings")
            self.global_(f"{_text(module_name)}.{_text(qual_name)}")
        elif name == "REDUCE":
            self.top(2)
            args = stack.pop()
            func = stack.pop()
            made = _call(func, args)
            self.check_reduce(func, args, made)
            if isinstance(made, TensorRef):
                self.result.tensors.append(made)
            stack.append(made)
        elif name in ("NEWOBJ", "NEWOBJ_EX"):
            if name == "NEWOBJ_EX":
                stack.pop()
            args = stack.pop()
            cls = stack.pop()
            cls_name = cls.name if isinstance(cls, Global) else _label(cls)
            argv = args if isinstance(args, tuple) else (args,)
            stack.append({} if cls_name in _DICT_FACTORIES else Obj(cls_name, argv))
        elif name == "OBJ":
            items = self.pop_mark()
            cls = items[0] if items else None
            stack.append(Obj(cls.name if isinstance(cls, Global) else "?", tuple(items[1:])))
        elif name == "BUILD":
            self.top(2)
            state = stack.pop()
            if not (isinstance(state, dict) and id(stack[-1]) in self.ordered):
                self.unlike("a state given to something other than an OrderedDict")
            if isinstance(stack[-1], Obj):
                stack[-1].state = state
        elif name == "BINPERSID":
            self.top(1)
            pid = stack.pop()
            if not _plain_storage_id(pid):
                self.unlike("a persistent id other than torch.save's storage tuple")
            stack.append(self.persistent(pid))
        elif name == "PERSID":
            stack.append(self.persistent(arg))
        elif name in ("EXT1", "EXT2", "EXT4"):
            self.global_(f"copyreg.extension.{arg}")
        elif name in ("NEXT_BUFFER", "READONLY_BUFFER"):
            stack.append(Call(name))
        elif name == "STOP":
            self.top(1)
            self.result.root = stack.pop() if stack else None
            return True
        elif name not in ("PROTO", "FRAME"):
            raise ValueError(f"opcode {name} not understood")
        return False


def _plain_storage_id(pid: object) -> bool:
    return (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
            and isinstance(pid[1], Global) and pid[1].name.rsplit(".", 1)[-1] in TORCH_STORAGES
            and pid[1].name.count(".") == 1 and isinstance(pid[2], str)
            and isinstance(pid[3], str) and type(pid[4]) is int)


_PUSH_ARG = {
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "BYTEARRAY8", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
}  # fmt: skip
_PUSH_CONST: dict[str, object] = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def _append(target: object, items: list[object]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Obj):
        target.args = (*target.args, *items)


def _setitems(target: object, items: list[object]) -> None:
    pairs = zip(items[::2], items[1::2], strict=False)
    if isinstance(target, dict):
        for key, value in pairs:
            target[dict_key(key)] = value
    elif isinstance(target, Obj):
        target.state = dict(pairs) if target.state is None else target.state


def read_pickle(data: bytes, start: int = 0) -> StaticResult:
    """Rebuild the pickle starting at ``start`` in ``data`` as stand-ins; never raises."""
    machine = _Machine()
    stream = io.BytesIO(data)
    stream.seek(start)
    position = start
    try:
        for count, (opcode, arg, pos) in enumerate(pickletools.genops(stream)):
            position = pos if pos is not None else position
            machine.result.opcodes.add(opcode.name)
            if count > MAX_OPS:
                raise ValueError("too many opcodes")
            if machine.step(opcode.name, arg):
                machine.result.end = stream.tell()
                return machine.result
    except Exception as exc:  # any damage in untrusted bytes is reported, not raised
        machine.result.error = _damage(exc)
        machine.result.error_offset = position
        machine.result.root = _bottom(machine.stack)
        return machine.result
    machine.result.error = "the pickle ends without a STOP opcode"
    machine.result.error_offset = position
    machine.result.root = _bottom(machine.stack)
    return machine.result


def _bottom(stack: list[object]) -> object:
    """What a pickle cut short leaves as its root: the first item of its stack (a MARK
    aside)."""
    return next((item for item in stack if item is not _MARK), None)


def _damage(exc: Exception) -> str:
    """What stopped the read, in words that quote nothing of the pickle: a failed memo
    lookup's key or pickletools' complaint about a value would be bytes of the file."""
    if isinstance(exc, KeyError):
        return "a memo lookup of an entry never stored"
    if isinstance(exc, IndexError):
        return "an opcode found the stack empty"
    return foreign(str(exc)) or type(exc).__name__
