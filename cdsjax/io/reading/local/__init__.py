"""llama.cpp's server on this machine as a reader: :mod:`~cdsjax.io.reading.local.reader` (``LocalReader``),
its model file (``model``), its start (``launch``), the server process (``serve``), the shared servers' records
(``records``) and the servers this process holds (``held``)."""
