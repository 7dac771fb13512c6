"""Dependencies of the staff, issue and inbox routes: the staff views and the roles.

Roles come from the JWT: staff for staff routes, a representative to open an investigation,
an operator to retry a workflow, a reviewer to review; anyone else gets 403.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.frame.auth import Principal
from api.frame.deps import require_role
from api.staff.views import StaffViews


async def get_staff_views(request: Request) -> StaffViews:
    return request.app.state.staff


StaffViewsDep = Annotated[StaffViews, Depends(get_staff_views)]
StaffDep = Annotated[Principal, Depends(require_role("staff"))]
StaffReadDep = Annotated[Principal, Depends(require_role("staff", "representative"))]
RepresentativeDep = Annotated[Principal, Depends(require_role("representative"))]
OperatorDep = Annotated[Principal, Depends(require_role("operator"))]
WorkflowReadDep = Annotated[Principal, Depends(require_role("staff", "operator"))]
ReviewerDep = Annotated[Principal, Depends(require_role("reviewer"))]
ReviewReadDep = Annotated[Principal, Depends(require_role("reviewer", "staff"))]
NOT_FOUND = {404: {"description": "No such issue."}}
