"""tinyamp.nn: registration and names, checkpoints, layers' math, causal attention, training."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.tensor import Tensor

pytestmark = pytest.mark.nn


def assert_bit_equal(a: np.ndarray, b: np.ndarray) -> None:
    """Same dtype, shape and bytes: stricter than ==, which calls -0.0 and 0.0 equal."""
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


class Affine(nn.Module):
    """A hand-made module: a parameter, a submodule, then another parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(np.ones(3, np.float32))
        self.inner = nn.Linear(3, 3)
        self.shift = nn.Parameter(np.zeros(3, np.float32))

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x * self.scale) + self.shift


# ---- Parameter and registration --------------------------------------------------------------
def test_parameter_is_a_leaf_that_requires_grad_and_ops_on_it_give_plain_tensors() -> None:
    p = nn.Parameter([1.0, 2.0])
    assert isinstance(p, Tensor) and p.requires_grad and p.is_leaf and p.dtype == np.float32
    y = p * 2
    assert type(y) is Tensor  # Tensor._make's fast path is untouched
    y.sum().backward()
    np.testing.assert_array_equal(p.grad, [2.0, 2.0])
    with pytest.raises(TypeError, match="floating-point"):
        nn.Parameter(np.arange(3))


def test_module_registers_parameters_and_submodules_in_assignment_order() -> None:
    m = Affine()
    assert [n for n, _ in m.named_parameters()] == ["scale", "shift", "inner.weight", "inner.bias"]
    assert [n for n, _ in m.named_modules()] == ["", "inner"]
    assert m.children() == [m.inner]
    m.scale = nn.Parameter(np.full(3, 2, np.float32))  # reassigning keeps the name's place
    assert [n for n, _ in m.named_parameters()][:2] == ["scale", "shift"]
    m.shift = None
    assert "shift" not in dict(m.named_parameters())
    del m.inner
    assert [n for n, _ in m.named_parameters()] == ["scale"]


def test_module_refuses_unregistrable_assignments() -> None:
    class Early(nn.Module):
        def __init__(self) -> None:
            self.w = nn.Parameter([1.0])

    with pytest.raises(AttributeError, match="super\\(\\).__init__\\(\\)"):
        Early()
    with pytest.raises(TypeError, match="nn.Parameter"):
        Affine().extra = ta.tensor([1.0], requires_grad=True)


def test_a_shared_parameter_is_listed_once() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    b.weight = a.weight
    model = nn.Sequential(a, b)
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    assert model.num_parameters() == 4 + 2 + 2


def test_buffers_are_saved_when_persistent_and_are_not_parameters() -> None:
    m = nn.Linear(2, 2)
    m.register_buffer("count", ta.tensor([3.0]))
    m.register_buffer("cache", ta.tensor([1.0]), persistent=False)
    assert list(m.state_dict()) == ["weight", "bias", "count"]
    assert [n for n, _ in m.named_buffers()] == ["count", "cache"]
    assert len(m.parameters()) == 2
    m.count = ta.tensor([4.0])  # reassigning a buffer keeps it a buffer
    assert m.state_dict()["count"][0] == 4.0


def test_zero_grad_drops_every_gradient() -> None:
    m = Affine()
    m(ta.tensor(np.ones((2, 3), np.float32))).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


# ---- names, counts, init ------------------------------------------------------------------------
def test_mlp_names_layers_and_counts_parameters() -> None:
    model = nn.MLP([784, 1024, 1024, 10])
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert [p.shape for p in model.parameters()] == [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    assert model.num_parameters() == 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert [type(m).__name__ for m in nn.MLP([3, 4, 5], activation="tanh")] == ["Linear", "Tanh", "Linear"]
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.MLP([3, 4], activation="swish")


def test_mlp_init_is_pytorch_uniform_drawn_from_the_cpu_generator() -> None:
    """W then b of each layer from U(-1/sqrt(in), 1/sqrt(in)), in float64, rounded once."""
    ta.manual_seed(3)
    model = nn.MLP([5, 7, 3])
    rng = np.random.default_rng(3)
    for fan_in, layer in ((5, model[0]), (7, model[2])):
        bound = 1 / np.sqrt(fan_in)
        assert_bit_equal(layer.weight.data, rng.uniform(-bound, bound, layer.weight.shape).astype(np.float32))
        assert_bit_equal(layer.bias.data, rng.uniform(-bound, bound, layer.bias.shape).astype(np.float32))


def test_embedding_init_standard_deviations() -> None:
    """PyTorch's N(0, 1) for nn.Embedding; GPT-2's N(0, 0.02^2) inside CharTransformer."""
    w = nn.Embedding(1000, 64).weight.data  # 64,000 samples: the sample std is within ~0.003 of 1
    assert abs(float(w.std()) - 1.0) < 0.02 and abs(float(w.mean())) < 0.02
    tok = nn.CharTransformer(1000, 8, 64, 4, 1).tok_emb.weight.data
    assert abs(float(tok.std()) - 0.02) < 0.0004


def test_char_transformer_names_and_count() -> None:
    V, bs, C, L = 11, 8, 16, 2
    model = nn.CharTransformer(V, bs, C, heads=4, layers=L)
    names = [n for n, _ in model.named_parameters()]
    block = [
        "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
        "ln2.weight", "ln2.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
    ]  # fmt: skip
    expected = ["tok_emb.weight", "pos_emb.weight"]
    expected += [f"blocks.{i}.{n}" for i in range(L) for n in block]
    expected += ["ln_f.weight", "ln_f.bias", "head.weight", "head.bias"]
    assert names == expected
    per_block = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    assert model.num_parameters() == V * C + bs * C + L * per_block + 2 * C + C * V + V
    assert dict(model.named_parameters())["blocks.1.attn.qkv.weight"].shape == (3 * C, C)


def test_repr_is_a_tree_of_modules_and_settings() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Dropout(0.1)))
    assert repr(model) == (
        "Sequential(\n"
        "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Sequential(\n"
        "    (0): Dropout(p=0.1)\n"
        "  )\n"
        ")"
    )
    assert repr(nn.LayerNorm(4)) == "LayerNorm(4, eps=1e-05)"


# ---- containers, modes ----------------------------------------------------------------------------
def test_sequential_indexing_slicing_and_iteration() -> None:
    layers = [nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)]
    s = nn.Sequential(*layers)
    assert len(s) == 3 and s[0] is layers[0] and s[-1] is layers[2] and list(s) == layers
    head = s[:2]
    assert isinstance(head, nn.Sequential) and list(head) == layers[:2]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        s[3]
    x = ta.tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    assert_bit_equal(s(x).data, layers[2](layers[1](layers[0](x))).data)
    assert_bit_equal(s(x).data, s[2:](head(x)).data)


def test_module_list_registers_appended_modules() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])
            self.layers.append(nn.Linear(2, 1, bias=False))

    m = Stack()
    assert [n for n, _ in m.named_parameters()] == ["layers.0.weight", "layers.0.bias", "layers.1.weight"]
    assert len(m.layers) == 2
    with pytest.raises(NotImplementedError, match="forward"):
        m.layers(ta.tensor([1.0, 2.0]))


def test_train_and_eval_switch_dropout_in_the_whole_tree() -> None:
    ta.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Sequential(nn.Dropout(0.5)), nn.Linear(64, 4))
    x = ta.tensor(np.ones((16, 8), np.float32))
    hidden = model[1]
    h = model[0](x)
    assert all(m.training for m in model.modules())
    dropped = hidden(h).data
    assert (dropped == 0).mean() > 0.3  # about half of 1024 values are zeroed
    kept = dropped != 0
    np.testing.assert_array_equal(dropped[kept], (h.data * np.float32(2.0))[kept])
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    assert hidden(h) is h  # identity: the same tensor, no copy
    model.train()
    assert all(m.training for m in model.modules())


# ---- checkpoints ------------------------------------------------------------------------------
def tiny_transformer(seed: int) -> nn.CharTransformer:
    ta.manual_seed(seed)
    return nn.CharTransformer(vocab_size=7, block_size=6, dim=8, heads=2, layers=2).eval()


def test_state_dict_copies_and_loads_bit_identically_in_place() -> None:
    a, b = tiny_transformer(0), tiny_transformer(1)
    sd = a.state_dict()
    assert list(sd) == [n for n, _ in a.named_parameters()]
    sd_before = {k: v.copy() for k, v in sd.items()}
    a.head.weight.data += 1  # a copy: training on must not change a checkpoint
    assert_bit_equal(sd["head.weight"], sd_before["head.weight"])
    a.load_state_dict(sd)
    arrays = [p.data for p in b.parameters()]
    assert b.load_state_dict(sd) == ([], [])
    assert all(p.data is arr for p, arr in zip(b.parameters(), arrays))  # copied into the same arrays
    for (name, p), (name_a, q) in zip(b.named_parameters(), a.named_parameters()):
        assert name == name_a
        assert_bit_equal(p.data, q.data)
    idx = np.random.default_rng(0).integers(0, 7, (3, 6))
    assert_bit_equal(a(idx).data, b(idx).data)


@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=4), dtype=st.sampled_from(["float16", "float32"]))
def test_state_dict_round_trip_for_any_mlp(sizes: list[int], dtype: str) -> None:
    ta.manual_seed(0)
    a = nn.MLP(sizes, dtype=dtype)
    ta.manual_seed(1)
    b = nn.MLP(sizes, dtype=dtype)
    b.load_state_dict(a.state_dict())
    x = ta.tensor(np.linspace(-1, 1, 2 * sizes[0]).reshape(2, sizes[0]), dtype=dtype)
    assert_bit_equal(a(x).data, b(x).data)


def test_load_state_dict_names_missing_and_unexpected_keys() -> None:
    model = nn.MLP([3, 4, 2])
    sd = model.state_dict()
    del sd["2.bias"]
    sd["3.weight"] = np.zeros((2, 4), np.float32)
    with pytest.raises(nn.StateDictError, match=r"missing keys .*: 2\.bias(.|\n)*unexpected keys .*: 3\.weight"):
        model.load_state_dict(sd)
    result = model.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["2.bias"] and result.unexpected_keys == ["3.weight"]


def test_load_state_dict_names_shape_and_dtype_mismatches_and_changes_nothing() -> None:
    model = nn.MLP([3, 4, 2])
    before = [p.data.copy() for p in model.parameters()]
    sd = nn.MLP([3, 4, 2]).state_dict()
    sd["0.weight"] = np.zeros((4, 5), np.float32)
    with pytest.raises(nn.StateDictError, match=r"shape mismatch for 0\.weight: the model has shape \(4, 3\), "
                       r"the state_dict \(4, 5\)"):  # fmt: skip
        model.load_state_dict(sd)
    sd["0.weight"] = np.zeros((4, 3), np.float16)
    with pytest.raises(nn.StateDictError, match="dtype mismatch for 0.weight: the model has dtype float32, "
                       "the state_dict float16"):  # fmt: skip
        model.load_state_dict(sd, strict=False)
    sd["0.weight"] = [[0.0] * 3] * 4
    with pytest.raises(nn.StateDictError, match="0.weight: expected a NumPy or CuPy array, got list"):
        model.load_state_dict(sd)
    for p, b in zip(model.parameters(), before):  # other keys were valid, yet nothing was copied
        assert_bit_equal(p.data, b)


def test_to_keeps_tensor_objects_and_names_unknown_devices() -> None:
    model = nn.Linear(2, 2)
    w = model.weight
    assert model.to("cpu") is model and model.weight is w
    with pytest.raises(ta.DeviceError, match="unknown device 'tpu'"):
        model.to("tpu")


@pytest.mark.skipif(not ta.cuda_is_available(), reason="needs CuPy and a CUDA GPU")
def test_to_cuda_and_back_moves_parameters_and_gradients_in_place() -> None:
    model = tiny_transformer(0)
    idx = np.random.default_rng(0).integers(0, 7, (2, 6))
    expected = model(idx).data
    weight = model.head.weight
    model.to("cuda")
    assert model.head.weight is weight and all(p.device == "cuda" for p in model.parameters())
    logits = model(ta.tensor(idx, device="cuda"))
    ta.cross_entropy(logits, ta.tensor(idx, device="cuda")).backward()
    model.to("cpu")
    assert all(p.device == "cpu" and p.grad is not None and isinstance(p.grad, np.ndarray) for p in model.parameters())
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-4, atol=1e-5)  # cuBLAS vs OpenBLAS sums


# ---- layers compute their formulas -------------------------------------------------------------------
def test_linear_layernorm_embedding_compute_their_formulas() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    lin = nn.Linear(4, 5, dtype="float64")
    np.testing.assert_allclose(lin(ta.tensor(x)).data, x @ lin.weight.data.T + lin.bias.data, rtol=1e-14)
    assert nn.Linear(4, 5, bias=False).bias is None
    ln = nn.LayerNorm(4, eps=1e-3, dtype="float64")
    ln.weight.data[:] = [1.0, 2.0, 3.0, 4.0]
    ln.bias.data[:] = 0.5
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-3) * ln.weight.data + 0.5
    np.testing.assert_allclose(ln(ta.tensor(x)).data, expected, rtol=1e-12)
    emb = nn.Embedding(10, 3)
    idx = np.array([[1, 9], [1, 0]])
    assert_bit_equal(emb(idx).data, emb.weight.data[idx])


# ---- causal self-attention ---------------------------------------------------------------------------
def attention_reference(x: np.ndarray, attn: nn.CausalSelfAttention) -> np.ndarray:
    """Per-head loops in plain NumPy: rows [0, C) of qkv.weight make Q, [C, 2C) K, [2C, 3C) V."""
    B, T, C = x.shape
    H, hd = attn.heads, C // attn.heads
    qkv = x @ attn.qkv.weight.data.T + attn.qkv.bias.data
    q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]
    out = np.zeros_like(x)
    for b in range(B):
        for h in range(H):
            cols = slice(h * hd, (h + 1) * hd)
            for t in range(T):
                s = q[b, t, cols] @ k[b, : t + 1, cols].T / math.sqrt(hd)  # keys 0..t only
                w = np.exp(s - s.max())
                out[b, t, cols] = (w / w.sum()) @ v[b, : t + 1, cols]
    return out @ attn.proj.weight.data.T + attn.proj.bias.data


def layer_norm_reference(x: np.ndarray, ln: nn.LayerNorm) -> np.ndarray:
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * ln.weight.data + ln.bias.data


def block_reference(x: np.ndarray, block: nn.TransformerBlock) -> np.ndarray:
    """x + attn(ln1(x)), then x + W2 gelu(W1 ln2(x) + b1) + b2, all in NumPy."""
    x = x + attention_reference(layer_norm_reference(x, block.ln1), block.attn)
    fc, out = block.mlp[0], block.mlp[2]
    h = layer_norm_reference(x, block.ln2) @ fc.weight.data.T + fc.bias.data
    h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    return x + h @ out.weight.data.T + out.bias.data


def test_char_transformer_matches_a_numpy_reference() -> None:
    ta.manual_seed(0)
    model = nn.CharTransformer(vocab_size=7, block_size=6, dim=8, heads=2, layers=2, dtype="float64")
    for m in model.modules():  # LayerNorms start as 1 and 0; make each one distinct
        if isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, 0.3)
            nn.init.normal_(m.bias, 0.0, 0.3)
    idx = np.random.default_rng(0).integers(0, 7, (2, 5))
    x = model.tok_emb.weight.data[idx] + model.pos_emb.weight.data[:5]
    for block in model.blocks:
        x = block_reference(x, block)
    expected = layer_norm_reference(x, model.ln_f) @ model.head.weight.data.T + model.head.bias.data
    np.testing.assert_allclose(model(idx).data, expected, rtol=1e-10, atol=1e-12)


def test_attention_matches_a_per_head_reference() -> None:
    ta.manual_seed(0)
    attn = nn.CausalSelfAttention(dim=6, heads=3, dtype="float64")
    x = np.random.default_rng(1).standard_normal((2, 5, 6))
    np.testing.assert_allclose(attn(ta.tensor(x)).data, attention_reference(x, attn), rtol=1e-12, atol=1e-14)


@given(t=st.integers(0, 5), new_token=st.integers(0, 6))
def test_a_future_token_does_not_change_earlier_logits(t: int, new_token: int) -> None:
    model = tiny_transformer(0)
    idx = np.random.default_rng(0).integers(0, 7, (2, 6))
    changed = idx.copy()
    changed[:, t] = new_token
    a, b = model(idx).data, model(changed).data
    assert_bit_equal(a[:, :t], b[:, :t])  # exactly: masked weights are exactly 0
    if new_token not in idx[:, t]:
        assert not np.array_equal(a[:, t:], b[:, t:])


def test_causal_mask_fits_float16_and_keeps_the_past_exact_in_float16() -> None:
    mask = nn.causal_mask(3, np.dtype(np.float16), "cpu")
    assert mask.dtype == np.float16 and mask[0, 1] == np.finfo(np.float16).min and mask[1, 0] == 0
    ta.manual_seed(0)
    block = nn.TransformerBlock(8, 2, dtype="float16")
    x = np.random.default_rng(0).standard_normal((1, 5, 8)).astype(np.float16)
    y = x.copy()
    y[0, 3:] *= 40  # big scores push score + finfo.min past -65520 to -inf: still exact, still finite
    out_x, out_y = block(ta.tensor(x)).data, block(ta.tensor(y)).data
    assert np.isfinite(out_x).all() and np.isfinite(out_y).all()
    assert_bit_equal(out_x[0, :3], out_y[0, :3])


def test_attention_gradients_match_finite_differences() -> None:
    ta.manual_seed(0)
    attn = nn.CausalSelfAttention(4, 2, dtype="float64")
    x = ta.tensor(np.random.default_rng(2).standard_normal((2, 3, 4)), requires_grad=True)
    assert ta.gradcheck(lambda x, *params: attn(x), [x, *attn.parameters()])


# A residual x + f(x) whose x is itself computed exposes a bug in autograd.topological_order
# (a node is marked visited when pushed, so it can be ordered before one of its consumers and
# that consumer's gradient is dropped).  strict: once the core is fixed these XPASS and fail,
# which is the signal to delete the marks.


def test_transformer_block_gradients_match_finite_differences() -> None:
    ta.manual_seed(0)
    block = nn.TransformerBlock(4, 2, mlp_ratio=2, dtype="float64")
    x = ta.tensor(np.random.default_rng(2).standard_normal((2, 3, 4)), requires_grad=True)
    assert ta.gradcheck(lambda x, *params: block(x), [x, *block.parameters()])


def test_char_transformer_loss_gradients_match_finite_differences() -> None:
    ta.manual_seed(0)
    model = nn.CharTransformer(vocab_size=5, block_size=4, dim=4, heads=2, layers=2, dtype="float64")
    idx = np.random.default_rng(0).integers(0, 5, (2, 4))
    assert ta.gradcheck(lambda *params: ta.cross_entropy(model(idx), idx), model.parameters())


def test_char_transformer_rejects_sequences_longer_than_its_block() -> None:
    with pytest.raises(ValueError, match="T <= block_size=6; got shape \\(1, 7\\)"):
        tiny_transformer(0)(np.zeros((1, 7), np.int64))


def test_attention_dropout_is_active_only_in_training() -> None:
    ta.manual_seed(0)
    attn = nn.CausalSelfAttention(8, 2, dropout=0.5)
    x = ta.tensor(np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32))
    assert not np.array_equal(attn(x).data, attn(x).data)  # two different masks
    attn.eval()
    assert_bit_equal(attn(x).data, attn(x).data)


# ---- training end to end -------------------------------------------------------------------------------
def test_mlp_with_sgd_learns_a_problem_no_linear_model_can() -> None:
    """XOR of the quadrants: the best linear classifier scores about 2/3; this must reach 95%."""
    ta.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (512, 2)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.int64)
    model = nn.MLP([2, 32, 32, 2])
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    xt, yt = ta.tensor(x[:400]), ta.tensor(y[:400])
    for _ in range(300):
        opt.zero_grad()
        ta.cross_entropy(model(xt), yt).backward()
        opt.step()
    with ta.no_grad():
        train_acc = (model(xt).numpy().argmax(1) == y[:400]).mean()
        test_acc = (model(ta.tensor(x[400:])).numpy().argmax(1) == y[400:]).mean()
    assert train_acc > 0.95 and test_acc > 0.95


def test_char_transformer_overfits_a_short_string() -> None:
    ta.manual_seed(0)
    text = "tinyamp trains in float16! "
    chars = sorted(set(text))
    data = np.array([chars.index(c) for c in text * 3])
    T = 16
    idx = ta.tensor(np.stack([data[s : s + T] for s in range(len(text))]))
    targets = ta.tensor(np.stack([data[s + 1 : s + T + 1] for s in range(len(text))]))
    model = nn.CharTransformer(len(chars), T, dim=32, heads=4, layers=2)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = ta.cross_entropy(model(idx), targets)
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    assert first > 2.5  # about ln(18) = 2.89 at init: nothing is known yet
    assert loss.item() < 0.15
