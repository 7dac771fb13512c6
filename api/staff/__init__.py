"""Staff and participants' issue products: their views of the staff topics, and the routes.

Every route answers at once: a command acknowledged by its writer, a workflow started on the
log (202 with an id to read later), or this edge's view of the log. None calls a model.

Public names: ``router`` (``/staff``, its review queue's stream included, ``/issues``,
``/me/issues``, ``/me/inbox``) and ``StaffViews`` (what the edge's tail feeds).
"""

from fastapi import APIRouter

from api.staff import contributions, inbox, issues, research, review_queue, reviews, workflows
from api.staff.views import StaffViews

router = APIRouter()
for _module in (issues, research, workflows, reviews, review_queue):
    router.include_router(_module.router)
router.include_router(contributions.public)
router.include_router(contributions.mine)
router.include_router(inbox.router)

__all__ = ["StaffViews", "router"]
