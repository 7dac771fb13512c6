"""Dependencies of the staff, issue and inbox routes: the staff views and the roles.

Each route requires a capability (``streams.capabilities`` maps roles to them); a caller whose
role in its tenant lacks it gets 403.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.frame.auth import Principal
from api.frame.deps import require
from api.staff.views import StaffViews


async def get_staff_views(request: Request) -> StaffViews:
    return request.app.state.staff


StaffViewsDep = Annotated[StaffViews, Depends(get_staff_views)]
IssuesManageDep = Annotated[Principal, Depends(require("issues.manage"))]
IssuesReadDep = Annotated[Principal, Depends(require("issues.read"))]
InvestigateDep = Annotated[Principal, Depends(require("investigate"))]
WorkflowRetryDep = Annotated[Principal, Depends(require("workflows.retry"))]
WorkflowReadDep = Annotated[Principal, Depends(require("workflows.read"))]
ReviewDecideDep = Annotated[Principal, Depends(require("reviews.decide"))]
ReviewReadDep = Annotated[Principal, Depends(require("reviews.read"))]
NOT_FOUND = {404: {"description": "No such issue."}}
