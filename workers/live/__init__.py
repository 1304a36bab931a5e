"""What the platform pushes live: the workers app's channel-layer events (``events``), a
signed-in user's dashboard feed (``dashboard``) and a task page's live state (``task_page``)."""
