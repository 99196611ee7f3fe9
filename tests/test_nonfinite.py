"""The non-finite step guard: which steps count as non-finite, the streak that stops a run and its one-line
message, and the finite check of weights and optimizer state."""

import math

import pytest
import torch

from sparserl.errors import SparserlError
from sparserl.train.nonfinite import (
    NonfiniteSteps,
    NonfiniteTrainingError,
    all_finite,
    first_nonfinite,
    is_finite_number,
)


@pytest.mark.parametrize(
    "loss, grad_norm, ok",
    [
        (0.5, 1.0, True),
        (torch.tensor(0.5), torch.tensor(2.0), True),
        (0.5, None, True),
        (math.nan, 1.0, False),
        (0.5, math.inf, False),
        (torch.tensor(-math.inf), 1.0, False),
        (torch.tensor(0.1), torch.tensor(math.nan), False),
        (torch.tensor([1.0, math.nan]), 1.0, False),
    ],
)
def test_a_step_is_finite_when_its_loss_and_gradient_norm_are(loss, grad_norm, ok):
    assert NonfiniteSteps.finite(loss, grad_norm) is ok


def test_limit_steps_in_a_row_raise_one_line_naming_step_count_and_causes():
    guard = NonfiniteSteps(3)
    assert [
        guard.record(s, ok) for s, ok in [(1, True), (2, False), (3, False), (4, True), (5, False), (6, False)]
    ] == [0, 1, 1, 0, 1, 1]  # a finite step resets
    assert (guard.in_a_row, guard.skipped) == (2, 4)
    with pytest.raises(NonfiniteTrainingError) as e:
        guard.record(7, False)
    msg = str(e.value)
    assert isinstance(e.value, SparserlError) and "\n" not in msg
    assert "step 7" in msg and "3 steps in a row" in msg and "train.max_nonfinite_steps=3" in msg
    for cause in ("rewards or advantages", "learning rate", "cannot score"):
        assert cause in msg


def test_limit_one_stops_at_the_first_and_the_state_survives_a_resume():
    with pytest.raises(NonfiniteTrainingError, match="step 1:"):
        NonfiniteSteps(1).record(1, False)
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        NonfiniteSteps(0)
    guard = NonfiniteSteps(2)
    guard.record(1, False)
    again = NonfiniteSteps(2)
    again.load_state_dict(guard.state_dict())
    with pytest.raises(NonfiniteTrainingError, match="2 steps in a row"):
        again.record(2, False)


def test_from_config_reads_train_max_nonfinite_steps():
    from types import SimpleNamespace

    cfg = SimpleNamespace(train=SimpleNamespace(max_nonfinite_steps=5))  # the shape of Config's train section
    assert NonfiniteSteps.from_config(cfg).limit == 5
    assert NonfiniteSteps.from_config(object()).limit == 3


def test_weights_and_optimizer_state_are_checked_tensor_by_tensor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model.register_buffer("steps", torch.tensor([1, 2]))  # an integer tensor is never non-finite
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    assert all_finite(model) and all_finite(model.state_dict()) and all_finite(opt)
    assert first_nonfinite({"a": [torch.ones(2), torch.empty(0)]}) is None
    with torch.no_grad():
        model[1].bias[0] = math.inf
        model[0].weight[2, 1] = math.nan
    assert first_nonfinite(model) == "0.weight"  # the first in state-dict order
    assert not all_finite(model.state_dict())
    opt.state[model[1].weight]["exp_avg_sq"][0, 0] = math.nan
    assert first_nonfinite(opt) == "state.2.exp_avg_sq"
    assert is_finite_number(torch.tensor([1, 2])) and not is_finite_number(float("nan"))
