"""What a user gets: launch files for the trainers (``emit``), the HTML report (``report``) and the
terminal explanations (``explain``). Reads plan documents and predictions; never searches."""
