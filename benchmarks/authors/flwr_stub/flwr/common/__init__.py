"""flwr.common (0.17): Weights/Parameters/FitRes and the ndarray <-> bytes conversion.

Like Flower 0.17, parameters travel as np.save bytes (allow_pickle=False), so the server
never shares memory with a client's tensors."""
from dataclasses import dataclass, field
from io import BytesIO

import numpy as np

Scalar = bool | bytes | float | int | str
Weights = list[np.ndarray]


@dataclass
class Parameters:
    tensors: list[bytes]
    tensor_type: str = "numpy.ndarray"


@dataclass
class FitRes:
    parameters: Parameters
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)


def ndarray_to_bytes(a: np.ndarray) -> bytes:
    buf = BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def bytes_to_ndarray(b: bytes) -> np.ndarray:
    return np.load(BytesIO(b), allow_pickle=False)


def weights_to_parameters(weights: Weights) -> Parameters:
    return Parameters(tensors=[ndarray_to_bytes(w) for w in weights])


def parameters_to_weights(parameters: Parameters) -> Weights:
    return [bytes_to_ndarray(t) for t in parameters.tensors]
