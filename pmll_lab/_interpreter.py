"""Round-to-nearest-even bf16 stores in the Triton interpreter (applied by ``pmll_lab.backend``).

A kernel that stores fp32 values into a bf16 buffer (``tl.store(p_bf16, x_fp32)`` or
``x.to(tl.bfloat16)``) rounds them to nearest, ties to even, on a GPU (PTX ``cvt.rn.bf16.f32``,
Triton's default downcast rounding). Triton 3.6's interpreter truncates instead: its
``InterpreterBuilder.cast_impl`` converts fp32 to bf16 by dropping the low 16 bits, ignoring the
RTNE mode Triton's front end asks for. On the CPU every bf16 output, window and ring write was
then up to 1 ulp low in magnitude (64 of 128 ``gdn_decode`` bf16 outputs differed from the GPU's
rounding, and 400 gated bf16 ring writes drifted -9.5 % against -5.0 %). fp32 to fp16 goes
through numpy's ``astype``, which already rounds to nearest even.

``install()`` wraps ``cast_impl`` so that fp32 to bf16 rounds to nearest even, the bits
``torch.Tensor.to(torch.bfloat16)`` gives (NaN becomes the quiet NaN ``0x7FC0``, overflow gives
inf); every other cast is left to Triton. It patches the interpreter only: compiled kernels
never see it, so the GPU pays nothing, and both backends store the same bits from the same fp32
value. Idempotent.

It also wraps ``create_dot``: the interpreter keeps bf16 tensors as their uint16 bit patterns and
multiplied those patterns as integers in ``tl.dot`` (the ring form's bf16 products came out as
inf/NaN). bf16 operands are widened to the fp32 values they hold first, the products a GPU's
bf16 MMA forms exactly before its fp32 accumulation.

And it silences one warning of the interpreter's own: NumPy's "Conversion of an array with
ndim > 0 to a scalar" ``DeprecationWarning``, which Triton 3.6 raises in its ``__index__`` of a
one-element tensor on every interpreted program (thousands per test run); only warnings issued
from ``triton.runtime.interpreter`` with that message are dropped (``INTERPRETER_WARNINGS``).

``tensor_loop_variables(fn)`` is opt-in, per kernel: the interpreter hands a ``range`` loop's
body a Python int where compiled Triton has an int32 tensor, so a peer's kernel that calls
``t.to(...)`` on it runs on a GPU but not here (SGLang's exact fold does).
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

INTERPRETER_WARNINGS = (
    ("Conversion of an array with ndim > 0 to a scalar", DeprecationWarning,
     r"triton\.runtime\.interpreter"),
)
"""(message start, category, module regex) of the warnings the interpreter itself raises and
``install`` filters; ``pyproject.toml``'s pytest ``filterwarnings`` names the same one (pytest
resets the filters for every test)."""


def rne_bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bit patterns of fp32 ``x`` rounded to bf16, to nearest with ties to even."""
    x = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16).reshape(x.shape)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """fp32 values of bf16 bit patterns (uint16, as the interpreter holds bf16 tensors)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def install() -> None:
    """Patch ``triton.runtime.interpreter.InterpreterBuilder.cast_impl`` (fp32 -> bf16 rounds
    to nearest even), wraps ``create_dot`` (bf16 operands as their values) and filters
    ``INTERPRETER_WARNINGS``. Call only with ``TRITON_INTERPRET=1`` set (``pmll_lab.backend``
    does)."""
    import triton.language as tl
    from triton.runtime import interpreter

    for message, category, module in INTERPRETER_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_pmll_lab_rne", False):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(rne_bf16_bits(src.data), dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl._pmll_lab_rne = True
    builder.cast_impl = cast_impl

    original_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (interpreter.TensorHandle(bf16_values(x.data), tl.float32)
                if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot



def tensor_loop_variables(fn) -> None:
    """Run the interpreted kernel ``fn`` with the variable of every ``for x in range(...)`` loop
    held as an int32 tensor, as compiled Triton holds it (an ``scf.for`` induction variable):
    the interpreter iterates a Python ``range`` and hands the body a Python int, so a body that
    calls a tensor method on it (``t.to(tl.int64)``) fails on the CPU only. ``tl.static_range``
    loops keep their ints (constexpr when compiled too). Applies to ``fn`` alone (a
    ``triton.runtime.interpreter.InterpretedFunction`` not yet launched) through its own AST
    rewriter, so every other kernel is interpreted as before. Idempotent; ``ValueError`` naming
    ``fn`` for anything else or a kernel already launched."""
    from triton.runtime import interpreter

    if not isinstance(fn, interpreter.InterpretedFunction):
        raise ValueError(f"fn: expected an interpreted Triton kernel, got {type(fn).__name__}")
    cls = _loop_variable_rewriter()
    if isinstance(fn.rewriter.ast_transformer, cls):
        return
    if fn.fn in interpreter.InterpretedFunction.rewritten_fn:
        raise ValueError(f"fn: {fn.__name__} was already launched; rewrite it before its first "
                         "launch")
    fn.rewriter.ast_transformer = cls()


@lru_cache(maxsize=1)
def _loop_variable_rewriter():
    """The interpreter's AST rewriter plus ``x = to_tensor(x)`` at the head of the body of each
    ``for x in range(...)`` (the builtin ``range`` only)."""
    import ast

    from triton.runtime import interpreter

    class LoopVariableRewriter(interpreter.ASTTransformer):
        def visit_For(self, node):
            self.generic_visit(node)
            it, target = node.iter, node.target
            if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                    and it.func.id == "range" and isinstance(target, ast.Name)):
                semantic = ast.Name(id="interpreter_semantic", ctx=ast.Load())
                value = ast.Call(func=ast.Attribute(value=semantic, attr="to_tensor",
                                                    ctx=ast.Load()),
                                 args=[ast.Name(id=target.id, ctx=ast.Load()),
                                       ast.Constant(value=False)], keywords=[])
                node.body.insert(0, ast.Assign(targets=[ast.Name(id=target.id, ctx=ast.Store())],
                                               value=value))
            return node

    return LoopVariableRewriter
