"""After the plan: putting a plan on hosts again when hardware fails (``replan``)."""
