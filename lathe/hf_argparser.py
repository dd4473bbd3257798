"""transformers.hf_argparser's import path."""

from lathe.train.args.parser import (  # noqa: F401
    DataClass,
    DataClassType,
    HfArg,
    HfArgumentParser,
    make_choice_type_function,
    string_to_bool,
)
