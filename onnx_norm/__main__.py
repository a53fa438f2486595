"""`python -m onnx_norm`: the `onnx-norm` command."""

import sys

from onnx_norm.cli import main

sys.exit(main())
