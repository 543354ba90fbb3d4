"""Talking to the API server; the only package that does.

Public: :mod:`driver.kube.http` (``KubeClient``: the plugin's thin client on ``http.client``,
no ``kubernetes`` or urllib3 import), :mod:`driver.kube.client` (``api_client``, ``send``:
the official ``kubernetes`` client for the controller, CLI and tools) and
:mod:`driver.kube.kubeconfig` (credentials from a kubeconfig or the in-cluster service
account, one selection rule).
"""
