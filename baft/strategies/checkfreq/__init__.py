"""``checkfreq``: a copy at the boundary, persisted in the background (:mod:`.strategy`)."""
