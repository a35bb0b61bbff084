"""What people and models are shown, shared by the admission side and the
operator side: refusal texts, command lines and operation views
(``messages``), the gate as a status document and Prometheus gauges
(``status``), terminal output (``render``).  Imports only ``storage``.
"""
