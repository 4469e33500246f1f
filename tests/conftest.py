pytest_plugins = ["rayconnect.kafka.fixtures"]
