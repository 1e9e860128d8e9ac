"""A test method whose clients hang in round 1 (for tests of stopping a run that waits)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, Server


class Config(ProtocolConfig):
    rounds: int = 3


class HangClient(Client):
    def handle(self, msg: Message) -> Message:
        if int(msg["r"]) == 1:
            mark = os.environ.get("RAYMVC_TEST_HANG_MARK")
            if mark:  # tells the test that a client now hangs
                Path(mark).touch()
            time.sleep(3600)
        return Message("ok", v=np.zeros(2))


class HangServer(Server):
    def start(self) -> dict[int, Message]:
        return {c: Message("go", r=0) for c in self.ctx.client_ids}

    def step(self, round, replies, missing):
        if round >= 2:
            return Done(labels=np.zeros(self.ctx.n_samples, dtype=np.int64))
        return {c: Message("go", r=round + 1) for c in self.ctx.client_ids}


PROTOCOL = Protocol(name="hang_in_round_one", config=Config, client=HangClient, server=HangServer,
                    partition="horizontal", summary="a test method: clients hang in round 1")
