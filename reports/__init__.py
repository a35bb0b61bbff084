"""What people and models are shown, shared by the admission and operator
sides (the modules: README §Project layout).  Imports only ``storage``.
"""
