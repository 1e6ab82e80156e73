"""The bridge's shared secret: made on first use, kept under the runtime home.

A peer proves it may talk to the runtime by sending this token in its hello; the DSH
plugin gets it through its config. Only the owner can read the file.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from loopdock.runtime import FILE_MODE, private_dir

from ._errors import TokenFileError

TOKEN_FILE = "bridge.token"


def _write_private(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # whatever the umask took away
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")


def load_or_create_token(home: Path) -> str:
    """The token stored at ``<home>/bridge.token``, created (mode 0600) if there is none.

    Safe against a concurrent first use: the new file is written aside and linked into
    place, so two processes never read a half-written token or end up with two tokens.
    An existing file that others may read is made private again; the home is made
    private (0700) like the runtime makes it.
    """
    private_dir(home)
    path = home / TOKEN_FILE
    if not path.exists():
        draft = home / f".{TOKEN_FILE}.{secrets.token_hex(8)}"
        _write_private(draft, secrets.token_urlsafe(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process won the race: use its token
        finally:
            draft.unlink()
    if stat.S_IMODE(path.stat().st_mode) != FILE_MODE:
        path.chmod(FILE_MODE)
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise TokenFileError(f"{path} holds no token: delete it to have a new one made")
    return token
