"""The legacy ``nvidia.com/gpu`` fallback webhook and its TLS.

Public: :mod:`controller.webhook.server` (the HTTPS server), :mod:`controller.webhook.pods`
(pod mutation: extended resources to claims), :mod:`controller.webhook.tls` (the Secret the
leader keeps) and :mod:`controller.webhook.certs` (CA and serving certificates).
"""
