"""For a test whose input 0 is complex (`cast_input0_to_complex`)."""

import torch

# ---------------------------------------------------------------- script text


def as_complex0(args_kwargs):
    """Input 0 travels as real [..., 2] and is rebuilt as complex."""
    args, kwargs = args_kwargs
    if not args[0].is_complex():
        args[0] = torch.view_as_complex(args[0])
    return args, kwargs
