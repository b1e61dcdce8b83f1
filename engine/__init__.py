# The optional compiled build (engine/compiled.py) goes in front of the import
# system here, before any engine module loads, when DISAGG_SIM_COMPILED asks for it.
from .compiled import install_from_environment

install_from_environment()
