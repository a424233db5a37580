// The chat: messages streamed through /v1/chat/completions, each answer with a button to look inside.
"use strict";

const conversation = [];  // {role, content}, the system message not included
const messagesBox = document.getElementById("messages");
const promptBox = document.getElementById("prompt");
const sendButton = document.getElementById("send");

function settings() {
  const number = (id) => Number(document.getElementById(id).value);
  return {
    temperature: number("temperature"), top_k: number("top_k"), top_p: number("top_p"),
    min_p: number("min_p"), max_tokens: number("max_tokens"),
  };
}

function withSystem(messages) {
  const system = document.getElementById("system").value.trim();
  return system ? [{ role: "system", content: system }, ...messages] : messages;
}

function bubble(role, text) {
  const element = document.createElement("div");
  element.className = "message " + role;
  element.textContent = text;
  messagesBox.appendChild(element);
  element.scrollIntoView({ block: "end" });
  return element;
}

async function send(text) {
  const before = conversation.slice();
  conversation.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant", "");
  answer.classList.add("streaming");
  sendButton.disabled = true;
  const sampling = settings();
  let content = "";
  try {
    const body = { model: refllm.model, messages: withSystem(conversation), stream: true, ...sampling };
    await refllm.stream("/v1/chat/completions", body, (chunk) => {
      for (const choice of chunk.choices) {
        if (choice.delta && choice.delta.content) {
          content += choice.delta.content;
          answer.textContent = content;
        }
      }
    });
  } catch (error) {
    answer.remove();
    conversation.splice(before.length);
    bubble("error", error.message);
    return;
  } finally {
    answer.classList.remove("streaming");
    sendButton.disabled = false;
  }
  conversation.push({ role: "assistant", content });
  const look = document.createElement("button");
  look.type = "button";
  look.className = "look";
  look.textContent = "look inside";
  const asked = withSystem(conversation.slice(0, -1));
  look.addEventListener("click", () => showInside(asked, content, sampling));
  answer.appendChild(look);
}

document.getElementById("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = promptBox.value.trim();
  if (!text || sendButton.disabled) return;
  promptBox.value = "";
  send(text);
});

promptBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    document.getElementById("composer").requestSubmit();
  }
});

document.getElementById("reset").addEventListener("click", () => {
  conversation.length = 0;
  messagesBox.replaceChildren();
});

(async () => {
  try {
    const models = await (await refllm.call("/v1/models")).json();
    refllm.model = models.data[0].id;
    document.getElementById("model").textContent = refllm.model;
    const info = await (await refllm.call("/v1/model/info")).json();
    document.getElementById("status").textContent =
      `${info.architecture}, ${(info.num_parameters / 1e6).toFixed(1)} M parameters, context ${info.context_length}`;
  } catch (error) {
    document.getElementById("model").textContent = "not connected: " + error.message;
  }
})();
