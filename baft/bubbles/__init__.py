"""The bubbles: each stage's idle windows measured (:mod:`~baft.bubbles.profiler`), a copy packed into
them (:mod:`~baft.bubbles.planner`), run there (:mod:`~baft.bubbles.copier`), and the gate that lets the
persister's Python run only inside them (:mod:`~baft.bubbles.idlegate`)."""
