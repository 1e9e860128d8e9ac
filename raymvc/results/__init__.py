"""What a run leaves: its folder (``folder``: lock, marker, whole-file writes; ``runfolder``:
RunFolder), its summary (``summary``), how it ended (``status``) and what it depends on
(``provenance``)."""
