"""A tiny stand-in for the parts of Flower 0.17 that the FCUIF code imports (no networking,
no Ray, no simulation): the driver (../../driver.py) runs the rounds itself."""
from . import client, common, server  # noqa: F401

__version__ = "0.17-stub"
