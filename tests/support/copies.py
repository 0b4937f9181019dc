"""The three ways a user copies a torch-class object (or a drop-in holding one)."""
import copy
import io
import pickle

import torch

COPY_WAYS = ["pickle", "deepcopy", "torch.save"]


def copy_by(how, obj):
    if how == "pickle":
        return pickle.loads(pickle.dumps(obj))
    if how == "deepcopy":
        return copy.deepcopy(obj)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)
