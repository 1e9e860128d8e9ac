"""flwr.client (0.17): only the NumPyClient base class is used by the FCUIF client."""


class NumPyClient:
    pass


def start_numpy_client(*args, **kwargs):
    raise RuntimeError("flwr stub: no networking; run the rounds with driver.py")
