"""Walking a state_dict, written once: its tensors taken out into a list and
put back (a layout of TensorSlots travels or is kept in their place), the
rest of the tree (dicts, lists, tuples, other values) as it is."""

from typing import Any, Callable, List


class TensorSlot:
    """A tensor's place in a stripped state_dict: its index in the tensor list,
    shape and dtype, a DTensor's spec (placements, global shape, stride;
    None for a plain tensor), and the type of the device it was on ("cpu",
    "cuda": a rank that takes it puts it on its own device of that type)."""

    def __init__(self, index: int, shape: tuple, dtype, spec=None, device: str = "cpu") -> None:
        self.index, self.shape, self.dtype, self.spec, self.device = index, shape, dtype, spec, device


def place(slot: TensorSlot):
    """Where this rank puts slot's tensor: its current CUDA device for a CUDA
    tensor (the sender's cuda:1 is this rank's own GPU), else the host (a
    host tensor, or no GPU here)."""
    import torch
    if slot.device == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def walk(tree: Any, is_leaf: Callable[[Any], bool], leaf: Callable[[Any], Any]) -> Any:
    """tree with each leaf (is_leaf) replaced by leaf(it), dicts, lists and tuples rebuilt."""
    if is_leaf(tree):
        return leaf(tree)
    if isinstance(tree, dict):
        return {k: walk(v, is_leaf, leaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(walk(v, is_leaf, leaf) for v in tree)
    return tree


def strip(tree: Any, tensors: list, local: Callable[[Any], tuple]) -> Any:
    """tree with every tensor replaced by its TensorSlot; appends to tensors
    what local(tensor) makes of each ((the tensor to keep, its spec)), in
    index order."""
    import torch

    def take(t):
        kept, spec = local(t)
        tensors.append(kept)
        return TensorSlot(len(tensors) - 1, tuple(kept.shape), kept.dtype, spec, kept.device.type)
    return walk(tree, lambda x: isinstance(x, torch.Tensor), take)


def fill(tree: Any, tensor: Callable[[TensorSlot], Any]) -> Any:
    """A stripped tree with each TensorSlot replaced by tensor(slot)."""
    return walk(tree, lambda x: isinstance(x, TensorSlot), tensor)


def slots(tree: Any) -> List[TensorSlot]:
    """The TensorSlots of a stripped tree, in the order of their index."""
    found: List[TensorSlot] = []
    walk(tree, lambda x: isinstance(x, TensorSlot), found.append)
    return sorted(found, key=lambda sl: sl.index)
