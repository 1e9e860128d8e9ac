from . import client_proxy, strategy  # noqa: F401
