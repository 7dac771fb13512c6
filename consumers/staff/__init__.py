"""The staff domain on the worker: the issue and inbox writers, the developments handler,
and the research, disclosure-review and update-delivery workflows (on the workflow engine).

Pure parts (no I/O): ``detectors``, ``reasoning``, ``render``, ``issues``, ``inbox``,
``developments``. Public names: ``Staff`` (``Staff().register(ctx)``).
"""

from consumers.staff.worker import Staff

__all__ = ["Staff"]
