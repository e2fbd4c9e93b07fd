"""Ranks under mslaunch's agents on remote hosts: the backend, the fleet of
hosts and their handles, the agents kept between attempts, the bootstrap and
the package it sends, and the starters (:mod:`.starters`)."""
