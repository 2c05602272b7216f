"""Out-of-range probabilities are refused when the model or criterion is built, naming the option:
dropout options outside [0, 1], --label-smoothing outside [0, 1)."""
import pytest

from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from fairseq_lightseq.models.ls_transformer import LSTransformerModel

from support.models import build, make_task


@pytest.mark.parametrize("name", ["dropout", "attention_dropout", "activation_dropout", "relu_dropout"])
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_dropout_out_of_range_refused_at_build(name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} must be in \\[0, 1\\], got {value}"):
        build(LSTransformerModel, make_task(), **{name: value})


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_dropout_limits_accepted(value):
    build(LSTransformerModel, make_task(), dropout=value, attention_dropout=value, activation_dropout=value)


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_label_smoothing_out_of_range_refused_at_build(value):
    with pytest.raises(ValueError, match=f"--label-smoothing must be in \\[0, 1\\), got {value}"):
        LsLabelSmoothedCrossEntropyCriterion(make_task(), False, value)


@pytest.mark.parametrize("value", [0.0, 0.1, 0.99])
def test_label_smoothing_in_range_accepted(value):
    assert LsLabelSmoothedCrossEntropyCriterion(make_task(), False, value).eps == value
