"""Prompt sets, written for this project: what people ask a voice assistant.

Three disjoint sets, so that nothing is measured on the data it was built from:
- ``COUNT_PROMPTS``: the target's replies to these are counted to choose the draft's reduced head (vocab.py);
- ``HELD_OUT``: head coverage, the acceptance floor test and the int4 target's quality are measured on these;
- the benchmark's own eight prompts (bench.py).
"""

from __future__ import annotations

SYSTEM = ("You are a helpful voice assistant. Answer in one to three short spoken sentences, "
          "with no lists, code or markdown.")

COUNT_PROMPTS = [
    # weather, time, everyday planning
    "Will I need an umbrella if it's cloudy this afternoon?", "What should I wear when it's five degrees outside?",
    "How long does it take for snow to melt on a sunny day?", "Why is the sky red at sunset?",
    "What's the difference between a hurricane and a typhoon?", "Is it safe to go running in a thunderstorm?",
    "How many days are there until the end of the year if today is October first?",
    "What time zone is New York in?", "How do I remember to drink more water during the day?",
    "Wake me up at seven tomorrow morning.", "Set an alarm for half past six.",
    "Start a timer for twenty minutes for my pasta.", "How long should I nap to feel refreshed?",
    "Plan a quick morning routine for me.", "What's a good way to organise my week?",
    "Remind me to call my mother this evening.", "How do I stop procrastinating?",
    "Give me a two minute breathing exercise.", "What's a polite way to decline an invitation?",
    # cooking and food
    "How long do I cook rice on the stove?", "What can I make with eggs, spinach and cheese?",
    "How do I know if an avocado is ripe?", "Can I freeze fresh bread?", "What temperature should chicken reach?",
    "How do I make a simple tomato sauce?", "What's a healthy snack for the afternoon?",
    "How long do hard boiled eggs keep in the fridge?", "What spices go well with roasted carrots?",
    "How do I keep pasta from sticking together?", "Suggest a quick vegetarian lunch.",
    "How do I make pancakes without milk?", "What's the difference between baking soda and baking powder?",
    "How much coffee is too much in a day?", "Is green tea good for you?", "How do I sharpen a kitchen knife?",
    "What can I use instead of butter in a cake?", "How do I cook salmon in the oven?",
    "Why do onions make you cry?", "What's a good side dish for grilled fish?",
    # science and nature
    "Why do cats purr?", "How far away is the moon?", "How do plants make food from sunlight?",
    "Why is the ocean salty?", "What causes the seasons?", "How do bees make honey?", "Why do leaves change colour?",
    "What is gravity?", "How hot is the sun?", "Why do we dream?", "How do vaccines work?", "What is DNA?",
    "Why do birds fly south in winter?", "How old is the universe?", "What's the biggest animal ever?",
    "How does a rainbow form?", "Why do stars twinkle?", "What is a volcano?", "How do whales breathe?",
    "Why is the grass green?", "How do magnets work?", "What are clouds made of?", "How fast does light travel?",
    "Do fish sleep?", "How do earthquakes happen?", "Why do we have leap years?", "What is an atom?",
    "How long do elephants live?", "Why do dogs wag their tails?", "What's the tallest tree in the world?",
    # geography, history, culture
    "What's the capital of Canada?", "Which is the longest river in the world?", "How many countries are in Africa?",
    "Who built the pyramids?", "When did people first land on the moon?", "Who painted the Mona Lisa?",
    "What language do they speak in Brazil?", "Why is Venice built on water?", "Who invented the telephone?",
    "What was the Renaissance?", "How tall is Mount Everest?", "What's the smallest country in the world?",
    "Who wrote Romeo and Juliet?", "What is the Great Wall of China?", "Why did the Titanic sink?",
    "What's the population of Japan?", "Where do kangaroos live?", "What currency do they use in Switzerland?",
    "Tell me something interesting about ancient Rome.", "Who was Marie Curie?", "What is the Olympic motto?",
    "How did the Eiffel Tower get built?", "What are the Northern Lights?", "What's a famous dish from Italy?",
    # health and body
    "How many hours of sleep do adults need?", "What are good stretches for a stiff back?",
    "How can I calm down before a presentation?", "How much should I walk every day?",
    "What helps with a sore throat?", "Why do muscles get sore after exercise?", "How do I stop hiccups?",
    "Is it bad to crack your knuckles?", "What's a good warm up before running?", "How can I improve my posture?",
    "Why do we yawn?", "How do I treat a small burn?", "What foods have a lot of iron?",
    # technology and home
    "How do I restart my router?", "Why is my phone battery draining so fast?", "What is a VPN?",
    "How do I make a strong password?", "What's the cloud in computing?", "How does wifi work?",
    "Turn off the lights in the living room.", "Set the thermostat to twenty one degrees.",
    "Why does my laptop get hot?", "How do I take a screenshot on a computer?", "What is artificial intelligence?",
    "How do electric cars work?", "What's the difference between RAM and storage?", "How do solar panels work?",
    "How can I save energy at home?", "What's a smart speaker?", "How do I clean my keyboard?",
    # language, numbers, learning
    "What does the word serendipity mean?", "How do you say thank you in Japanese?", "What's twelve times fifteen?",
    "What's fifteen percent of eighty?", "How many centimetres are in a foot?", "Spell the word necessary.",
    "What's a synonym for happy?", "How do I convert Celsius to Fahrenheit?", "What's the square root of 144?",
    "How many ounces are in a pound?", "What's the plural of cactus?", "How can I learn a new language faster?",
    "What's the difference between affect and effect?", "Give me a word that rhymes with orange.",
    "How many minutes are in a day?", "What is a prime number?", "How do I get better at mental maths?",
    # entertainment, sport, small talk
    "Tell me a joke.", "Tell me a short riddle.", "What's a good movie for a rainy evening?",
    "Recommend a book for a long flight.", "What are the rules of chess in short?", "How long is a football match?",
    "Who has won the most Olympic medals?", "What's a fun game to play with kids?", "Sing me a line of a lullaby.",
    "How are you today?", "What's your favourite colour?", "Can you tell me a bedtime story in two sentences?",
    "What should I name my new puppy?", "Give me a fun fact about space.", "What's a good hobby to start?",
    "How do I get better at drawing?", "What music helps with focus?", "Tell me something to cheer me up.",
    "What's a good podcast topic?", "How do you play the ukulele?", "What's the best way to learn guitar?",
    # travel and money
    "What should I pack for a weekend trip?", "How early should I get to the airport?",
    "How do I get over jet lag?", "What's a cheap way to travel in Europe?", "How do I save money on groceries?",
    "What's a budget and how do I make one?", "Should I tip in restaurants in Germany?",
    "How do I keep my passport safe when travelling?", "What's the best time to visit Japan?",
    "How do I avoid getting seasick?", "What's compound interest?", "How do I ask for a raise?",
    # home, garden, pets, family
    "How often should I water a cactus?", "Why are my tomato plants turning yellow?", "How do I get rid of ants?",
    "How do I remove a coffee stain?", "How often should I feed my cat?", "How do I train a puppy to sit?",
    "What's a good gift for a ten year old?", "How do I help my child sleep through the night?",
    "How can I make my small flat feel bigger?", "What's the best way to fold a shirt?",
    "How do I unclog a sink without chemicals?", "Why does my dog eat grass?", "How do I care for a goldfish?",
    "What flowers are easy to grow?", "How do I hang a picture straight?", "How do I get a baby to stop crying?",
    "Play some relaxing music.", "What's on my calendar tomorrow?", "Add milk and bread to my shopping list.",
    "Call my sister.", "Read me the news headlines.", "Turn the volume down.", "What can you do?",
]

HELD_OUT = [
    "How do I make iced tea at home?", "Why do cats like boxes?", "What's the capital of Norway?",
    "How can I fall asleep on a plane?", "What is photosynthesis in one sentence?", "Give me an idea for a picnic.",
    "How long should I boil potatoes?", "Why do we get goosebumps?", "What's a good way to start running?",
    "Tell me a fact about dolphins.", "How do I keep my houseplants alive?", "What is inflation?",
    "How many legs does a spider have?", "What's a nice thing to say to a friend who is sad?",
    "How do I clean a cast iron pan?", "What's the weather like in London in autumn?",
    "Set a reminder to water the plants on Sunday.", "Who discovered penicillin?", "Why is the moon sometimes orange?",
    "How do I make my bike go faster?", "What's a quick dessert I can make in ten minutes?",
    "How do airplanes stay in the air?", "What's a good stretch for tight shoulders?",
    "How can I be more productive in the morning?", "What's the difference between a frog and a toad?",
    "Tell me a short story about a robot.", "How do I write a thank you note?", "Why do we need sleep?",
    "What's the longest bridge in the world?", "How do I choose a good watermelon?",
    "Suggest a board game for four people.", "Why do my ears pop on a plane?",
]
