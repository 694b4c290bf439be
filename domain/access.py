"""Who is asking, and where they may go: the principal behind an API key.

A key identifies an owner (the producer) and may name the stock locations it
is for. A key that names none may use every location (every key configured
before locations could be named). A key that names some sees the others as
if nothing were there:

* a read at another location (a job, its events, rejections or retry, a
  shipment or receipt, the list) runs as :data:`NO_OWNER`: the store does the
  work it does for another owner's record, which is the work of a missing one,
  and answers "none" (the same 404 bytes; an empty list page);
* an upload to another location is refused before anything is recorded
  (:class:`LocationNotAllowed`, ``404 location.not_found``).
"""

from __future__ import annotations

from dataclasses import dataclass

from importer.domain.errors import LocationNotAllowed

#: The owner a read at a location the key does not allow runs as. No record
#: is ever bound to it (an owner starts with a letter or digit), so the store
#: takes the path of "another owner's record" and finds nothing.
NO_OWNER = "-"


#: The scope of a key that may read stock levels and every owner's stock movements
#: (GET /api/stock, /api/stock/{sku}, /api/stock-movements): stock belongs to the business.
STOCK_READ = "stock:read"
#: The scope of an operator's key: the routes under /api/ops/ (every location's queue,
#: the live workers, bulk retries, intake paused and resumed, any import's diagnostic).
OPS = "ops"
#: The scope that lets an operator's key upload shipments too (``importer dev``'s local key):
#: an operator's key (``ops``) does not upload without it; any other key uploads as ever.
IMPORTS = "imports"
#: Every scope a key may carry (``importer keys create NAME --scopes stock:read,ops``).
SCOPES = frozenset({STOCK_READ, OPS, IMPORTS})


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated producer: its owner, the locations its key allows (None: every one) and its scopes."""

    owner: str
    locations: frozenset[str] | None = None
    scopes: frozenset[str] = frozenset()

    @property
    def reads_stock(self) -> bool:
        return STOCK_READ in self.scopes

    @property
    def operates(self) -> bool:
        return OPS in self.scopes

    @property
    def uploads(self) -> bool:
        """Whether this key sends shipments: an operator's key only with the ``imports`` scope
        (docs/security.md, "An operator's key does not upload")."""
        return OPS not in self.scopes or IMPORTS in self.scopes

    def may_use(self, location: str) -> bool:
        return self.locations is None or location in self.locations

    def owner_at(self, location: str) -> str:
        """The owner to read ``location`` as: this owner, or NO_OWNER where the key does not reach."""
        return self.owner if self.may_use(location) else NO_OWNER

    def require(self, location: str) -> None:
        """Refuse (LocationNotAllowed) an upload to a location the key does not allow."""
        if not self.may_use(location):
            raise LocationNotAllowed()
