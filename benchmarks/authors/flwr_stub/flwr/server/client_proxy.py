class ClientProxy:
    def __init__(self, cid: str):
        self.cid = cid
