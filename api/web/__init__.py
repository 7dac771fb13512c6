"""The web pages the edge serves: participant (``/``), assistant (``/assistant``), staff
(``/staff``), their static files (``/static``), and — only in ``dev`` on a loopback bind — the
dev sign-in route that mints a token (``/dev/token``).

The pages are plain files calling the same public API any client calls, with the bearer in an
``Authorization`` header; nothing here reads a view or records a command. Public names:
``install_web`` (mounts it all on an app) and ``dev_signin_allowed``.
"""

from api.web.pages import install_web
from api.web.signin import dev_signin_allowed

__all__ = ["dev_signin_allowed", "install_web"]
