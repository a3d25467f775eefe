"""memlab.model.optimizers: the blockwise 8-bit Adam keeps bitsandbytes' memory layout and still optimises; every
optimizer name builds the torch optimizer the estimator assumes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from memlab.errors import SetupError
from memlab.measure.accounting import model_states
from memlab.model.optimizers import Adam8bit, PagedAdamW, build_optimizer
from memlab.predict.spec.setup import OPTIMIZERS

# bitsandbytes 0.50 Optimizer2State.init_state (Dettmers et al. 2022): tensors with >= 4096 elements get uint8 states
# and one fp32 absmax per 256-element block; smaller tensors keep fp32 states; two shared 256-entry fp32 maps.
BLOCK, MIN_8BIT, QMAPS = 256, 4096, 2 * 256 * 4


def _step_once(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    sum((p * p).sum() for p in params).backward()
    opt.step()


@pytest.mark.parametrize("numel", [1, 4095, 4096, 4097, 256 * 3 + 4096, 10_000])
def test_adam8bit_state_layout(numel: int) -> None:
    p = nn.Parameter(torch.randn(numel))
    opt = Adam8bit([p])
    _step_once(opt, [p])
    st = opt.state[p]
    assert st["step"] == 1 and isinstance(st["step"], int)  # a Python int: no tensor, no bytes
    if numel < MIN_8BIT:
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        shared = 0
        assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.float32
        assert st["exp_avg"].numel() == numel
        expected = 8 * numel
    else:
        blocks = math.ceil(numel / BLOCK)
        assert st["exp_avg"].dtype == torch.int8 and st["exp_avg_sq"].dtype == torch.uint8
        assert st["exp_avg"].numel() == st["exp_avg_sq"].numel() == numel
        assert st["absmax1"].dtype == st["absmax2"].dtype == torch.float32
        assert st["absmax1"].numel() == st["absmax2"].numel() == blocks
        expected = 2 * numel + 2 * 4 * blocks
        shared = QMAPS
    assert model_states(nn.ParameterList([p]), opt).optimizer_bytes == expected + shared


def test_adam8bit_state_of_a_matrix_is_about_a_quarter_of_adamw() -> None:
    p = nn.Parameter(torch.randn(256, 256))
    q = nn.Parameter(p.detach().clone())
    a8, aw = Adam8bit([p]), torch.optim.AdamW([q], foreach=False)
    _step_once(a8, [p])
    _step_once(aw, [q])
    b8 = model_states(nn.ParameterList([p]), a8).optimizer_bytes
    bw = model_states(nn.ParameterList([q]), aw).optimizer_bytes
    assert b8 == 2 * 65536 + 8 * 256 + QMAPS
    assert bw == 8 * 65536 + 4
    assert b8 / bw == pytest.approx(0.25, abs=0.01)


def _regression(opt_name: str, steps: int = 150) -> tuple[float, float]:
    torch.manual_seed(0)
    x = torch.randn(256, 64)
    true_w = torch.randn(64, 96)
    y = x @ true_w
    model = nn.Linear(64, 96, bias=True)  # 6144-element weight: 8-bit states; 96-element bias: fp32 states
    opt = build_optimizer(opt_name, model.parameters(), lr=3e-2)
    first = last = 0.0
    for i in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        if i == 0:
            first = loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = loss.item()
    return first, last


def test_adam8bit_decreases_the_loss_like_adamw() -> None:
    f8, l8 = _regression("adam-8bit")
    fw, lw = _regression("adamw")
    assert f8 == fw  # same start
    assert l8 < 0.05 * f8 and lw < 0.05 * fw
    assert l8 < 5 * lw + 1e-3


def test_adam8bit_weight_decay_shrinks_weights_without_gradient_signal() -> None:
    p = nn.Parameter(torch.ones(10))
    opt = Adam8bit([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros(10)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((10,), 1 - 0.1 * 0.5))


def test_adam8bit_skips_parameters_without_gradients() -> None:
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = Adam8bit([p, q])
    (p * 2).sum().backward()
    opt.step()
    assert q not in opt.state and torch.equal(q.detach(), torch.ones(3))
    assert not torch.equal(p.detach(), torch.ones(3))


@pytest.mark.parametrize(("name", "cls", "extra"), [
    ("adamw", torch.optim.AdamW, {}),
    ("adam", torch.optim.Adam, {}),
    ("sgd", torch.optim.SGD, {"momentum": 0}),
    ("sgd-momentum", torch.optim.SGD, {"momentum": 0.9}),
    ("adafactor", torch.optim.Adafactor, {}),
    ("adam-8bit", Adam8bit, {}),
    ("paged-adam-8bit", Adam8bit, {}),
    ("paged-adamw", PagedAdamW, {"weight_decay": 1e-2}),  # bitsandbytes' default
])
def test_build_optimizer_names(name: str, cls: type, extra: dict) -> None:
    opt = build_optimizer(name, [nn.Parameter(torch.zeros(2))], lr=0.5)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert group["lr"] == 0.5
    if "foreach" in group:
        assert group["foreach"] is False  # one tensor's transients at a time, as the estimator assumes
    for k, v in extra.items():
        assert group[k] == v


def test_every_setup_optimizer_is_buildable_and_unknown_is_a_setup_error() -> None:
    for name in OPTIMIZERS:
        build_optimizer(name, [nn.Parameter(torch.zeros(2))])
    with pytest.raises(SetupError, match="known: adamw"):
        build_optimizer("lion", [nn.Parameter(torch.zeros(2))])


def test_adafactor_keeps_factored_second_moments() -> None:
    """Shazeer & Stern 2018: an r x c matrix keeps r + c second-moment elements; a vector keeps n."""
    w, b = nn.Parameter(torch.randn(64, 80)), nn.Parameter(torch.randn(80))
    opt = build_optimizer("adafactor", [w, b])
    _step_once(opt, [w, b])
    # one 0-dim fp32 step per tensor (kept on the CPU by torch.optim.Adafactor) plus the factors
    assert model_states(nn.ParameterList([w, b]), opt).optimizer_bytes == 4 * ((64 + 80) + 80) + 2 * 4


def _generated_shapes(seed: int) -> list[tuple[int, ...]]:
    """Random 1-D and 2-D shapes straddling min_8bit_size and the 256-element blocks."""
    g = torch.Generator().manual_seed(seed)
    shapes: list[tuple[int, ...]] = [(4095,), (4096,), (1,)]
    for _ in range(6):
        rows, cols = (int(x) for x in torch.randint(1, 160, (2,), generator=g))
        shapes.append((rows, cols) if rows % 2 else (rows * cols,))
    return shapes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adam8bit_states_equal_bitsandbytes_adamw8bit_and_the_formula_to_the_byte(seed: int) -> None:
    """The real ``bnb.optim.AdamW8bit`` (runs on CPU), memlab's stand-in and ``adam8bit_bytes`` agree exactly."""
    bnb = pytest.importorskip("bitsandbytes")
    from memlab.predict.memory.states import adam8bit_bytes

    shapes = _generated_shapes(seed)
    counted = []
    for make in (lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3), Adam8bit):
        params = [nn.Parameter(torch.randn(shape)) for shape in shapes]
        opt = make(params)
        _step_once(opt, params)
        counted.append(model_states(nn.ParameterList(params), opt).optimizer_bytes)
    assert counted[0] == counted[1] == adam8bit_bytes(math.prod(s) for s in shapes)


def test_a_4096_element_tensor_holds_what_bitsandbytes_holds() -> None:
    """The brief's figure: 4,096 uint8 x 2 + 16 absmax x 2 x 4 B + two 1 KiB maps = 10,368 B."""
    from memlab.predict.memory.states import adam8bit_bytes

    assert adam8bit_bytes([4096]) == 10_368 and adam8bit_bytes([4095]) == 8 * 4095
