"""What a call did - a value or the kind of refusal - comparable between the
allocator reference model (ukv_torch.testing.allocator_model) and the torch
objects."""
import torch

from ukv_torch.testing.allocator_model import Exhausted, InvalidArgument, StateConflict


def model_outcome(call):
    try:
        return "ok", call()
    except InvalidArgument:
        return "invalid", None
    except StateConflict:
        return "state", None
    except Exhausted as exc:
        return "exhausted", exc.text


def torch_outcome(call):
    try:
        value = call()
    except ValueError:
        return "invalid", None
    except TypeError:  # a non-int argument, refused before the call (BatchCalls, the drop-in batches)
        return "bad_call", None
    except RuntimeError as exc:
        message = str(exc)
        if message.startswith("No free"):
            return "exhausted", message
        if "Expected a value of type" in message:
            return "bad_call", None
        return "state", None
    if isinstance(value, torch.Tensor):
        assert value.dtype == torch.int64 and value.dim() == 1
        value = value.tolist()
    return "ok", value


def assert_same_outcome(expected, actual, what):
    kind, value = expected
    assert actual[0] == kind, f"{what}: model {expected}, torch {actual}"
    if kind == "exhausted":
        assert actual[1].startswith(value), f"{what}: message {actual[1]!r} lacks the upstream text {value!r}"
    else:
        assert actual[1] == value, f"{what}: model {expected}, torch {actual}"
