"""A strict NumPy-backed stand-in for CuPy, to find host/device mixing in tinyamp without a GPU.

Put ``tests/strict_cupy`` first on PYTHONPATH and ``import cupy`` gets this module; the
test ``tests/test_strict_cupy.py`` runs the suite's GPU cases and the command line on it.
It is a test double, not an emulator of CUDA: arrays are NumPy arrays inside, kernels do
not run (tinyamp's GPU-only fast paths are switched to their generic code by
``strict_cupy_plugin``), and what it checks is where the data is, not the numbers.

Rules it enforces, as CuPy 14 does:
* a cupy.ndarray is NOT a numpy.ndarray; np.asarray(x)/np.array(x)/implicit conversion raise TypeError;
* ufuncs (np.add(x, y), x + y) dispatch here via __array_ufunc__; raw numpy.ndarray operands are
  rejected with TypeError (CuPy: "Unsupported type <class 'numpy.ndarray'>"); numpy/Python scalars ok;
* numpy functions dispatch here via __array_function__ only when cupy has a function of that name;
* cupy routines reject numpy.ndarray arguments except creation (array/asarray/...);
* index arrays may be numpy (CuPy converts them); a numpy array assigned through a basic index
  (x[...] = a, x[1:3] = a, x[0] = a) raises (CuPy: 'non-scalar numpy.ndarray cannot be used for
  fill'), other numpy values are logged;
* a device array is not a Python integer (CuPy's ndarray has no __index__);
* bfloat16 (kind 'V') is refused: tinyamp keeps it on the CPU, so one reaching a device array is a bug
  (CuPy 14 has initial bfloat16 support through ml_dtypes; tinyamp's GPU code does not use it).
Every violation is also appended to VIOLATIONS with a stack summary.  READS counts the
device-to-host reads (get, item, tolist, float, int, bool): on a GPU each makes the host wait.
"""

from __future__ import annotations

import sys
import traceback
import types

import numpy as _np

__version__ = "14.2.0-stand-in"
VIOLATIONS: list[str] = []
READS = [0]  # device-to-host reads so far (a list: tests read and reset READS[0])


def _basic_index(i) -> bool:
    """Ellipsis, None, slices and integers (and tuples of them): the indexes CuPy assigns through fill()."""
    if isinstance(i, tuple):
        return all(_basic_index(j) for j in i)
    return i is Ellipsis or i is None or isinstance(i, (slice, int, _np.integer))


def _violation(msg: str, exc: type = TypeError) -> None:
    stack = "".join(traceback.format_stack(limit=8)[:-2])
    VIOLATIONS.append(msg + "\n" + stack)
    raise exc(msg)


def is_available() -> bool:
    return True


def _check_dtype(dt) -> None:
    if dt is not None and _np.dtype(dt).kind == "V":
        _violation(f"strict CuPy stand-in: no kernel supports dtype {_np.dtype(dt)}")


def _unwrap(x, where: str, allow_host: bool = False):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _np.ndarray) and not allow_host:
        _violation(
            f"strict CuPy stand-in: {where} got a host numpy.ndarray (shape {x.shape}, {x.dtype}) "
            "mixed with device arrays"
        )
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, where, allow_host) for v in x)
    return x


def _wrap(r):
    if isinstance(r, _np.ndarray):
        return ndarray._from(r)
    if isinstance(r, _np.generic):  # cupy reductions/ufuncs return 0-d arrays, never numpy scalars
        return ndarray._from(_np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def _index(idx):
    if isinstance(idx, tuple):
        return tuple(_index(i) for i in idx)
    if isinstance(idx, ndarray):
        return idx._a
    return idx  # numpy arrays, lists, slices, ints: CuPy converts them


class _Flags:
    def __init__(self, a):
        self._a = a

    @property
    def c_contiguous(self):
        return self._a.flags.c_contiguous

    @property
    def f_contiguous(self):
        return self._a.flags.f_contiguous

    @property
    def owndata(self):
        return self._a.flags.owndata

    def __getitem__(self, k):
        return self._a.flags[k]


class ndarray:
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._a = _np.empty(shape, dtype)
        self._base = None

    @classmethod
    def _from(cls, a, base=None):
        obj = object.__new__(cls)
        if a.flags.writeable is False and a.base is not None:
            a = a.view()
            try:
                a.flags.writeable = True  # CuPy views (broadcast_to) are writable
            except ValueError:
                a = a.copy()
        obj._a = a
        obj._base = base
        return obj

    # ---- conversion
    def __array__(self, *a, **k):
        _violation("strict CuPy stand-in: Implicit conversion to a NumPy array is not allowed. Please use `.get()`")

    def get(self, stream=None, order="C", out=None):
        READS[0] += 1
        return self._a.copy()

    def item(self):
        READS[0] += 1
        return self._a.item()

    def tolist(self):
        READS[0] += 1
        return self._a.tolist()

    def __float__(self):
        READS[0] += 1
        return float(self._a)

    def __int__(self):
        READS[0] += 1
        return int(self._a)

    def __index__(self):  # CuPy 14's ndarray has none: a device scalar is not a Python integer
        _violation("strict CuPy stand-in: a cupy.ndarray used as a Python integer (CuPy has no __index__)")

    def __bool__(self):
        READS[0] += 1
        return bool(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return "stand-in " + repr(self._a)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __deepcopy__(self, memo):
        return self.copy()

    def __copy__(self):
        return self.copy()

    def __reduce__(self):
        _violation("strict CuPy stand-in: pickling a device array (copies through the host)")

    # ---- attributes
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: _Flags(s._a))
    device = property(lambda s: _Device())

    @property
    def base(self):
        return self._base

    @property
    def T(self):
        return ndarray._from(self._a.T, self._root())

    def _root(self):
        return self._base if self._base is not None else self

    # ---- views
    def reshape(self, *shape, order="C"):
        r = self._a.reshape(*shape)
        return ndarray._from(r, self._root() if _np.shares_memory(r, self._a) else None)

    def ravel(self):
        r = self._a.ravel()
        return ndarray._from(r, self._root() if _np.shares_memory(r, self._a) else None)

    def view(self, dtype=None):
        return ndarray._from(self._a.view() if dtype is None else self._a.view(dtype), self._root())

    def transpose(self, *axes):
        if len(axes) == 1:
            axes = axes[0]
        if isinstance(axes, ndarray):
            _violation("strict CuPy stand-in: transpose axes given as a device array")
        return ndarray._from(
            self._a.transpose(None if (isinstance(axes, tuple) and axes == ()) else axes), self._root()
        )

    def swapaxes(self, a, b):
        return ndarray._from(self._a.swapaxes(a, b), self._root())

    def __getitem__(self, idx):
        r = self._a[_index(idx)]
        if isinstance(r, _np.generic):
            r = _np.asarray(r)
        return ndarray._from(r, self._root() if _np.shares_memory(r, self._a) else None)

    def __setitem__(self, idx, value):
        if isinstance(value, _np.ndarray) and value.ndim > 0:
            if _basic_index(idx):  # CuPy fills a basic-indexed view with y.fill(value): no host array
                _violation(
                    "strict CuPy stand-in: x[...] = numpy_array: 'non-scalar numpy.ndarray cannot be used for fill'",
                    ValueError,
                )
            VIOLATIONS.append(f"(warning) host numpy array assigned into a device array at index {idx!r}")
        if isinstance(value, ndarray):
            _check_dtype(value.dtype)
            value = value._a
        _check_dtype(self.dtype)
        self._a[_index(idx)] = value

    # ---- methods
    def copy(self, order="C"):
        _check_dtype(self.dtype)
        return ndarray._from(self._a.copy())

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        _check_dtype(dtype)
        _check_dtype(self.dtype)
        r = self._a.astype(dtype, copy=copy)
        return self if (r is self._a) else ndarray._from(r)

    def fill(self, v):
        if isinstance(v, _np.ndarray) and v.ndim:
            _violation("strict CuPy stand-in: fill with a host array", ValueError)
        self._a.fill(v)

    def _reduce(self, name, *a, **k):
        _check_dtype(self.dtype)
        if "out" in k and k["out"] is not None:
            k["out"] = _unwrap(k["out"], name)
        return _wrap(getattr(self._a, name)(*a, **k))

    def dot(self, other):
        return sys.modules[__name__].dot(self, other)

    def scatter_add(self, idx, v):
        scatter_add_impl(self, idx, v)

    # ---- numpy protocol
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        args = []
        for x in inputs:
            if isinstance(x, ndarray):
                _check_dtype(x.dtype)
                args.append(x._a)
            elif isinstance(x, _np.ndarray):
                _violation(
                    f"strict CuPy stand-in: ufunc {ufunc.__name__} got a host numpy.ndarray operand "
                    f"(shape {x.shape}, {x.dtype}): 'Unsupported type <class numpy.ndarray>'"
                )
            elif isinstance(x, (list, tuple)):
                _violation(f"strict CuPy stand-in: ufunc {ufunc.__name__} got a Python {type(x).__name__} operand")
            else:
                args.append(x)
        out = kwargs.get("out")
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            for o in outs:
                if not isinstance(o, ndarray):
                    _violation(f"strict CuPy stand-in: ufunc {ufunc.__name__} out= is not a device array")
            kwargs["out"] = tuple(o._a for o in outs)
        if method != "__call__":
            if method == "at":
                _violation("strict CuPy stand-in: numpy ufunc.at on device arrays (use cupy.add.at)")
            r = getattr(ufunc, method)(*args, **kwargs)
        else:
            r = ufunc(*args, **kwargs)
        if out is not None:
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _wrap(r)

    def __array_function__(self, func, types_, args, kwargs):
        impl = getattr(sys.modules[__name__], func.__name__, None)
        if impl is None or impl is func or not callable(impl):
            _violation(f"strict CuPy stand-in: numpy.{func.__name__} has no CuPy implementation for device arrays")
        return impl(*args, **kwargs)


def _binop(name, reflected=False, inplace=False):
    uf = getattr(_np, name)

    def f(self, other):
        if isinstance(other, _np.ndarray) and not isinstance(other, ndarray):
            _violation(f"strict CuPy stand-in: '{name}' between a device array and a host numpy.ndarray {other.shape}")
        if inplace:
            return uf(self, other, out=self)
        return uf(other, self) if reflected else uf(self, other)

    return f


for _name, _dunder in [
    ("add", "add"),
    ("subtract", "sub"),
    ("multiply", "mul"),
    ("true_divide", "truediv"),
    ("floor_divide", "floordiv"),
    ("power", "pow"),
    ("matmul", "matmul"),
    ("mod", "mod"),
    ("bitwise_and", "and"),
    ("bitwise_or", "or"),
    ("bitwise_xor", "xor"),
    ("left_shift", "lshift"),
    ("right_shift", "rshift"),
]:
    setattr(ndarray, f"__{_dunder}__", _binop(_name))
    setattr(ndarray, f"__r{_dunder}__", _binop(_name, reflected=True))
    setattr(ndarray, f"__i{_dunder}__", _binop(_name, inplace=True))
for _name, _dunder in [
    ("less", "lt"),
    ("less_equal", "le"),
    ("greater", "gt"),
    ("greater_equal", "ge"),
    ("equal", "eq"),
    ("not_equal", "ne"),
]:
    setattr(ndarray, f"__{_dunder}__", _binop(_name))


def _reduction(name):
    return lambda self, *a, **k: self._reduce(name, *a, **k)


for _name in ("sum", "mean", "max", "min", "all", "any", "argmax"):
    setattr(ndarray, _name, _reduction(_name))
ndarray.__neg__ = lambda s: _np.negative(s)
ndarray.__pos__ = lambda s: s
ndarray.__abs__ = lambda s: _np.absolute(s)
ndarray.__invert__ = lambda s: _np.invert(s)
ndarray.__hash__ = None


def matmul(a, b, out=None):
    if (
        isinstance(a, _np.ndarray)
        and not isinstance(a, ndarray)
        or isinstance(b, _np.ndarray)
        and not isinstance(b, ndarray)
    ):
        _violation("strict CuPy stand-in: matmul with a host array")
    return _wrap(_np.matmul(_unwrap(a, "matmul"), _unwrap(b, "matmul")))


# ---- creation: host data allowed
def asarray(a, dtype=None, order=None, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return ndarray._from(_np.array(a, dtype=dtype, copy=True))


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    if isinstance(obj, ndarray):
        _check_dtype(dtype)
        r = obj._a.astype(dtype) if dtype is not None else obj._a
        return ndarray._from(_np.array(r, copy=True) if copy else r)
    return ndarray._from(_np.array(obj, dtype=dtype, copy=True, ndmin=ndmin))


asanyarray = asarray


def ascontiguousarray(a, dtype=None):
    if isinstance(a, ndarray):
        return ndarray._from(_np.ascontiguousarray(a._a, dtype=dtype))
    return ndarray._from(_np.ascontiguousarray(a, dtype=dtype))


def asnumpy(a, stream=None):
    return a.get() if isinstance(a, ndarray) else _np.asarray(a)


def result_type(*arrays_and_dtypes):
    return _np.result_type(*[a.dtype if isinstance(a, ndarray) else a for a in arrays_and_dtypes])


def _make(name):
    fn = getattr(_np, name)

    def f(*args, **kwargs):
        a = _unwrap(list(args), f"cupy.{name}")
        k = {key: _unwrap(v, f"cupy.{name}") for key, v in kwargs.items()}
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, ndarray):
                _check_dtype(v.dtype)
        if "dtype" in k:
            _check_dtype(k["dtype"])
        return _wrap(fn(*a, **k))

    f.__name__ = name
    return f


for _fn in [
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "stack",
    "concatenate",
    "split",
    "where",
    "dot",
    "broadcast_to",
    "isfinite",
    "isnan",
    "isinf",
    "count_nonzero",
    "exp",
    "log",
    "sqrt",
    "tanh",
    "maximum",
    "minimum",
    "abs",
    "absolute",
    "multiply",
    "add",
    "subtract",
    "divide",
    "true_divide",
    "negative",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "equal",
    "not_equal",
    "sign",
    "clip",
    "floor",
    "log2",
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "all",
    "any",
    "argmax",
    "cumsum",
    "reshape",
    "transpose",
    "swapaxes",
    "tile",
    "triu",
    "tril",
    "array_equal",
    "allclose",
    "isclose",
    "copyto",
    "ravel",
    "square",
    "power",
    "bitwise_and",
    "bitwise_or",
    "left_shift",
    "right_shift",
    "invert",
    "logical_not",
    "logical_and",
    "nonzero",
    "flatnonzero",
    "sort",
    "argsort",
    "unique",
    "linspace",
    "expand_dims",
    "squeeze",
    "atleast_1d",
    "prod",
    "var",
    "std",
    "float_power",
    "fabs",
    "round",
    "rint",
    "around",
]:
    if hasattr(_np, _fn):
        setattr(sys.modules[__name__], _fn, _make(_fn))

# CuPy's scatter-add is ufunc.at (add.at); cupyx.scatter_add is deprecated since CuPy 14.
add.at = lambda a, indices, b: scatter_add_impl(a, indices, b)  # noqa: E731, F821

# dtypes
for _t in [
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool_",
    "dtype",
    "newaxis",
    "inf",
    "nan",
    "pi",
    "finfo",
    "iinfo",
]:
    setattr(sys.modules[__name__], _t, getattr(_np, _t))


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", **kw):
        self.name = name

    def __call__(self, *args, **kwargs):
        _violation(f"strict CuPy stand-in: ElementwiseKernel {self.name} cannot run here", NotImplementedError)


class ReductionKernel(ElementwiseKernel):
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name="kernel", **kw):
        self.name = name


class RawKernel(ElementwiseKernel):
    def __init__(self, code, name, **kw):
        self.name = name


class _Device:
    id = 0

    def __init__(self, *a):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    compute_capability = "90"


class _Pool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self):
        pass


_pool = _Pool()


def get_default_memory_pool():
    return _pool


class _MemoryHook:
    name = "hook"

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass


class _Runtime:
    @staticmethod
    def getDeviceProperties(i):
        return {"name": b"Emulated GPU", "totalGlobalMem": 2**34, "major": 9, "minor": 0}

    @staticmethod
    def memGetInfo():
        return (2**33, 2**34)

    @staticmethod
    def runtimeGetVersion():
        return 13000

    @staticmethod
    def driverGetVersion():
        return 13000


cuda = types.SimpleNamespace(
    Device=_Device,
    MemoryHook=_MemoryHook,
    runtime=_Runtime(),
    is_available=lambda: True,
    nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),  # the compiler CuPy loads for every kernel
    Event=None,
    get_elapsed_time=None,
)


def scatter_add_impl(a, idx, v):
    if not isinstance(a, ndarray):
        _violation("strict CuPy stand-in, cupy.add.at: target is not a device array")
    if isinstance(v, _np.ndarray) and not isinstance(v, ndarray):
        _violation("strict CuPy stand-in, cupy.add.at: value is a host array")
    vv = v._a if isinstance(v, ndarray) else v
    if _np.dtype(getattr(vv, "dtype", _np.float64)).type not in (
        _np.int32,
        _np.float16,
        _np.float32,
        _np.float64,
        _np.uint32,
        _np.uint64,
    ):
        _violation(f"strict CuPy stand-in, cupy.add.at: unsupported dtype {getattr(vv, 'dtype', None)}")
    _np.add.at(a._a, _index(idx), vv)


ndarray.__module__ = "cupy"
