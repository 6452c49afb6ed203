"""The stubs (.pyi) and docstrings match the native module: every public method is typed and
documented, and the stubs name nothing the module lacks."""

import ast
from pathlib import Path

import railring

STUB = Path(railring.__file__).with_name("_railring.pyi")


def stub_members(cls):
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    raise AssertionError(f"{cls} is not in {STUB}")


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stubs_match_the_module():
    assert stub_members("Communicator") == public(railring.Communicator)
    assert stub_members("Handle") == public(railring.Handle)


def test_everything_is_documented():
    for cls in (railring.Communicator, railring.Handle):
        assert cls.__doc__
        for name in public(cls):
            assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"
    assert railring.init.__doc__ and "torchrun" in railring.init.__doc__
    for e in (railring.MismatchError, railring.TimeoutError, railring.InvalidArgumentError):
        assert issubclass(e, railring.Error) and e.__doc__
    assert issubclass(railring.InvalidArgumentError, ValueError)
    assert railring.DTYPES == ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
                               "float32", "float64"]
