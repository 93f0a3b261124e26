"""How a drafted block is checked: chain and tree verifiers behind one interface."""
