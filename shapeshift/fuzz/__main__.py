"""``python -m shapeshift.fuzz``: see shapeshift/fuzz/campaign.py."""

from .campaign import main

main()
